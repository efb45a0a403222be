"""StreamingSynthesize: text fragments split anywhere give the audio of the whole text.

The tiny random model barely listens to its text (its random text embeddings are tiny next to
the codec embeddings), so two different texts give the same codes and an equality test could
not fail. This module's server runs a copy whose text embeddings are scaled up until the text
decides the codes; the test checks that first.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
import torch

from clients.qwen3_tts_client import AudioFormat, TtsClient
from tests.service.helpers import GREEDY, RYAN, RunningServer, start_server
from tts_service.model.checkpoint import LoadedModel

# Whole-text calls on a CustomVoice model default to non-streaming text (as qwen-tts); these ask for streaming.
STREAMING_GREEDY = replace(GREEDY, non_streaming_text=False)

TEXT = "Hello there, friend."
TEXT_EMBEDDING_SCALE = 1000.0


def text_sensitive(model: LoadedModel) -> LoadedModel:
    talker = copy.deepcopy(model.talker)
    with torch.no_grad():
        talker.model.text_embedding.weight.mul_(TEXT_EMBEDDING_SCALE)
    return replace(model, talker=talker)


@pytest.fixture(scope="module")
def text_server(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    running = start_server(text_sensitive(tiny_models["custom_voice"]))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def text_client(text_server: RunningServer) -> Iterator[TtsClient]:
    with text_server.client() as tts:
        yield tts


def pcm16(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.int32)


def differs(a: np.ndarray, b: np.ndarray) -> bool:
    # Equal codes decode to equal audio; chunking may move a float by an ulp, so allow 2 PCM16 steps.
    return a.shape != b.shape or bool(np.abs(a - b).max() > 2)


def test_a_whole_text_call_defaults_to_non_streaming_text_as_qwen_tts_does_for_custom_voice(
        text_client: TtsClient) -> None:
    default = text_client.synthesize(TEXT, RYAN, AudioFormat("pcm16"), GREEDY)
    non_streaming = text_client.synthesize(TEXT, RYAN, AudioFormat("pcm16"), replace(GREEDY, non_streaming_text=True))
    streaming = text_client.synthesize(TEXT, RYAN, AudioFormat("pcm16"), STREAMING_GREEDY)
    assert not differs(pcm16(default.audio), pcm16(non_streaming.audio))
    assert differs(pcm16(default.audio), pcm16(streaming.audio))


def test_the_text_decides_the_audio_of_this_modules_model(text_client: TtsClient) -> None:
    one = text_client.synthesize(TEXT, RYAN, AudioFormat("pcm16"), STREAMING_GREEDY)
    other = text_client.synthesize("Goodbye now, enemies!", RYAN, AudioFormat("pcm16"), STREAMING_GREEDY)
    assert differs(pcm16(one.audio), pcm16(other.audio))


@pytest.mark.parametrize("fragments", [
    ["Hel", "lo th", "ere", ", fr", "ie", "nd."],
    list(TEXT),
    [TEXT],
], ids=["inside-words", "one-character-each", "whole"])
def test_text_streamed_in_fragments_gives_the_audio_of_the_whole_text(text_client: TtsClient,
                                                                      fragments: list[str]) -> None:
    # A whole text in streaming mode: what text streamed in fragments must give, split anywhere.
    whole = text_client.synthesize(TEXT, RYAN, AudioFormat("pcm16"), STREAMING_GREEDY)
    responses = list(text_client.streaming_synthesize(fragments, RYAN, AudioFormat("pcm16"), GREEDY))
    completion = responses[-1].completion
    assert completion.usage.audio_frames == whole.completion.usage.audio_frames
    assert completion.usage.input_tokens == whole.completion.usage.input_tokens
    assert completion.finish_reason == whole.completion.finish_reason
    streamed = pcm16(b"".join(response.chunk.audio for response in responses))
    assert not differs(streamed, pcm16(whole.audio))
