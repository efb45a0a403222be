"""Hostile input: every request message fuzzed, odd texts, broken reference audio and oversized messages.
The only answers allowed are OK and INVALID_ARGUMENT (or gRPC's own RESOURCE_EXHAUSTED for a message
over the size limit), and the server serves normally afterwards."""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
import pytest
import soundfile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clients.qwen3_tts_client import Generation, TtsClient, Voice, tts_pb2
from tests.service.helpers import RYAN, RunningServer, wait_until

pb: Any = tts_pb2
ALLOWED = {"OK", "INVALID_ARGUMENT"}
SHORT = Generation(temperature=0.0, max_audio_seconds=0.16)
FUZZ_SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                         suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
statuses: Counter[str] = Counter()


def status_of(call: Callable[[], object]) -> str:
    try:
        result = call()
        if hasattr(result, "__iter__") and not isinstance(result, (bytes, str)):
            for _ in result:  # type: ignore[union-attr]
                pass
    except grpc.RpcError as error:
        return error.code().name  # type: ignore[attr-defined]
    return "OK"


def assert_still_serves(client: TtsClient, server: RunningServer) -> None:
    assert wait_until(lambda: server.engine.num_live_requests == 0)
    assert client.synthesize("Still serving.", RYAN, generation=SHORT).completion.usage.audio_frames == 2


# -- fuzzing every message --------------------------------------------------------------------------



def mostly(valid: st.SearchStrategy[Any], wild: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Nine draws in ten from `valid`: a request with one or two wild fields reaches deeper into the server
    than one with every field wild, which the first check would refuse."""
    return st.sampled_from([True] * 9 + [False]).flatmap(lambda is_valid: valid if is_valid else wild)


floats = st.floats(width=32, allow_nan=True, allow_infinity=True)
texts = mostly(st.sampled_from(["Hello there.", "Hello, 你好, مرحبا, Привет!", "One, two."]),
               st.one_of(st.text(max_size=300), st.sampled_from([" ", "\x00\x01\x1b[31m", "🙂" * 20])))
voices = st.builds(
    pb.VoiceSelection,
    speaker=mostly(st.just("ryan"), st.one_of(st.text(max_size=30), st.just("../../../../etc/passwd"))),
    language=mostly(st.sampled_from(["", "english", "auto", "chinese"]), st.text(max_size=12)),
    instruction=mostly(st.just(""), st.text(max_size=60)),
    reference_audio=mostly(st.just(b""), st.binary(max_size=256)),
    reference_audio_pcm16_rate=mostly(st.just(0), st.integers(0, 2**32 - 1)),
    reference_text=mostly(st.just(""), st.text(max_size=30)), x_vector_only=mostly(st.just(False), st.just(True)))
audio_formats = st.builds(pb.AudioFormat, encoding=mostly(st.integers(0, 5), st.integers(6, 2**31 - 1)),
                          sample_rate=mostly(st.sampled_from([0, 8000, 16000, 24000, 48000]),
                                             st.integers(0, 2**32 - 1)))
GENERATION_FIELDS = (
    ("temperature", st.floats(0.0, 2.0, width=32), floats),
    ("top_k", st.integers(0, 100), st.integers(0, 2**32 - 1)),
    ("top_p", st.floats(0.125, 1.0, width=32), floats),
    ("repetition_penalty", st.floats(1.0, 2.0, width=32), floats),
    ("seed", st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)),
    ("max_audio_seconds", st.floats(0.01, 0.16), st.floats(allow_nan=True, allow_infinity=True)),
)


@st.composite
def generation_configs(draw: st.DrawFn) -> Any:
    config = pb.GenerationConfig(non_streaming_text=draw(st.booleans()))
    for name, valid, wild in GENERATION_FIELDS:
        choice = draw(st.sampled_from(["unset"] * 9 + ["valid"] * 9 + ["wild"] * 2))
        if choice != "unset":
            setattr(config, name, draw(valid if choice == "valid" else wild))
    return config


synthesize_requests = st.builds(pb.SynthesizeRequest, text=texts, voice=voices, audio_format=audio_formats,
                                generation=generation_configs())


@st.composite
def streaming_messages(draw: st.DrawFn) -> list[Any]:
    config = pb.StreamingSynthesizeRequest(config=pb.StreamingSynthesizeConfig(
        voice=draw(voices), audio_format=draw(audio_formats), generation=draw(generation_configs())))
    text = st.builds(lambda fragment: pb.StreamingSynthesizeRequest(text=fragment), texts)
    flush = st.builds(lambda marker: pb.StreamingSynthesizeRequest(flush=pb.Flush(marker=marker)), st.text(max_size=10))
    others = mostly(text, st.one_of(flush, st.just(config), st.just(pb.StreamingSynthesizeRequest())))
    rest = draw(st.lists(others, min_size=1, max_size=6))
    return [config, *rest] if draw(st.sampled_from([True, True, True, False])) else rest


@FUZZ_SETTINGS
@given(request=synthesize_requests)
def test_fuzzed_synthesize_requests_get_ok_or_invalid_argument(client: TtsClient, request: Any) -> None:
    status = status_of(lambda: client.stub.Synthesize(request, timeout=30))
    statuses[f"Synthesize {status}"] += 1
    assert status in ALLOWED


@FUZZ_SETTINGS
@given(request=synthesize_requests)
def test_fuzzed_synthesize_online_requests_get_ok_or_invalid_argument(client: TtsClient, request: Any) -> None:
    status = status_of(lambda: client.stub.SynthesizeOnline(request, timeout=30))
    statuses[f"SynthesizeOnline {status}"] += 1
    assert status in ALLOWED


@FUZZ_SETTINGS
@given(messages=streaming_messages())
def test_fuzzed_streaming_message_sequences_get_ok_or_invalid_argument(client: TtsClient,
                                                                      messages: list[Any]) -> None:
    status = status_of(lambda: client.stub.StreamingSynthesize(iter(messages), timeout=30))
    statuses[f"StreamingSynthesize {status}"] += 1
    assert status in ALLOWED


def test_after_the_fuzzing_the_server_serves_and_holds_nothing(
        client: TtsClient, custom_voice_server: RunningServer, report_figure: Callable[[str], None]) -> None:
    assert_still_serves(client, custom_voice_server)
    assert statuses, "the fuzz tests ran first"
    report_figure("fuzzing: " + ", ".join(f"{count} {name}" for name, count in sorted(statuses.items()))
                  + "; no other status, the server serving afterwards")


# -- odd text -------------------------------------------------------------------------------------------

ODD_TEXTS = {
    "10 MB of text": ("a" * 10_000_000, "INVALID_ARGUMENT"),
    "only whitespace": (" \t\n\u3000\u00a0 ", "INVALID_ARGUMENT"),
    "only emoji": ("🙂🎉🚀" * 10, "OK"),
    "control characters": ("Hello\x00\x07\x1b[2J\u202eworld\x7f", "OK"),
    "mixed scripts": ("Hello, 你好, こんにちは, مرحبا, Привет, नमस्ते!", "OK"),
    "lone surrogate escapes and combining marks": ("e\u0301\u0301\u0301 Z\u0336a\u0336l\u0336g\u0336o", "OK"),
}


@pytest.mark.parametrize("case", ODD_TEXTS, ids=list(ODD_TEXTS))
def test_odd_text_is_spoken_or_refused_naming_the_field(client: TtsClient, custom_voice_server: RunningServer,
                                                        case: str) -> None:
    text, expected = ODD_TEXTS[case]
    for name, call in (("Synthesize", lambda: client.synthesize(text, RYAN, generation=SHORT)),
                       ("SynthesizeOnline", lambda: client.synthesize_online(text, RYAN, generation=SHORT))):
        assert status_of(call) == expected, name
    if expected == "INVALID_ARGUMENT":
        with pytest.raises(grpc.RpcError) as caught:
            client.synthesize(text, RYAN, generation=SHORT)
        assert caught.value.details().startswith("text:")
    assert_still_serves(client, custom_voice_server)


def test_a_message_over_the_size_limit_is_refused_by_grpc_and_the_server_goes_on(
        custom_voice_server: RunningServer, client: TtsClient) -> None:
    too_big = pb.SynthesizeRequest(text="Hi.", voice=pb.VoiceSelection(speaker="ryan",
                                                                         reference_audio=b"\x00" * (33 * 2**20)))
    with pytest.raises(grpc.RpcError) as caught:
        client.stub.Synthesize(too_big, timeout=30)
    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert_still_serves(client, custom_voice_server)


# -- broken reference audio ---------------------------------------------------------------------------


def wav_bytes(seconds: float, rate: int) -> bytes:
    samples = (np.random.default_rng(0).standard_normal(int(seconds * rate)) * 3000).astype(np.int16)
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


REFERENCES = {
    "truncated WAV": (wav_bytes(1.0, 24000)[:30000], {"OK", "INVALID_ARGUMENT"}),
    "only a WAV header": (wav_bytes(1.0, 24000)[:44], {"INVALID_ARGUMENT"}),
    "8 kHz WAV": (wav_bytes(1.0, 8000), {"OK"}),
    "96 kHz WAV": (wav_bytes(1.0, 96000), {"OK"}),
    "a PNG file": (b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8, {"INVALID_ARGUMENT"}),
    "longer than the limit": (wav_bytes(6.0, 16000), {"INVALID_ARGUMENT"}),
}


@pytest.mark.parametrize("case", REFERENCES, ids=list(REFERENCES))
def test_broken_reference_audio_is_cloned_or_refused_naming_the_field(base_server: RunningServer,
                                                                      case: str) -> None:
    audio, allowed = REFERENCES[case]
    voice = Voice(reference_audio=audio, x_vector_only=True)
    with base_server.client() as client:
        try:
            client.synthesize("Hello.", voice, generation=SHORT)
            status = "OK"
        except grpc.RpcError as error:
            status = error.code().name
            assert error.details().startswith("voice.reference_audio"), error.details()
        assert status in allowed
        assert wait_until(lambda: base_server.engine.num_live_requests == 0)
        good = Voice(reference_audio=wav_bytes(1.0, 24000), x_vector_only=True)
        assert client.synthesize("Still cloning.", good, generation=SHORT).completion.usage.audio_frames == 2
