"""The batched runner (paged KV, slot state, static predictor cache) against the eager generate path."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from tts_service.eager.generate import GenerationRequest, generate_codes
from tts_service.eager.synthesize import EagerSynthesizer
from tts_service.engine.config import EngineConfig
from tts_service.model.prompts import SynthesisInput, VoiceClone
from tts_service.runner.config import RunnerConfig
from tts_service.runner.params import GenerationParams, SamplingParams
from tts_service.runner.runner import (
    AudioRestart,
    DecodeInput,
    HostCopy,
    ModelRunner,
    PrefillInput,
    StepInput,
    _IdStaging,
)

BLOCK_SIZE = 4


def runner_config(model, **settings) -> RunnerConfig:
    """Four slots of small blocks, the rest as the engine would configure it."""
    return EngineConfig(max_running=4, block_size=BLOCK_SIZE, **settings).runner_config(
        model.speech_config.frame_rate_hz)


def requests_for(model, num_frames: list[int]):
    prompts = EagerSynthesizer(model).prompts
    inputs = [SynthesisInput("Hello there, how are you?", "english", "ryan"),
              SynthesisInput("Short.", "auto", "eric", instruction="Whisper."),
              SynthesisInput("A longer sentence, so that the prompts differ in length a lot.", "french", "serena",
                             non_streaming_mode=True)]
    params = [GenerationParams(talker=SamplingParams(0.0), predictor=SamplingParams(0.0), max_new_frames=num_frames[0]),
              GenerationParams(seed=11, max_new_frames=num_frames[1], repetition_penalty=1.3),
              GenerationParams(talker=SamplingParams(0.7, top_k=5, top_p=0.8), seed=3,
                               max_new_frames=num_frames[2], min_new_frames=num_frames[2])]
    return [GenerationRequest(prompts.build(i), p) for i, p in zip(inputs, params, strict=True)]


def run_staggered(runner: ModelRunner, requests: list[GenerationRequest], admit_at: list[int],
                  pad_id: int, audio: list[list[np.ndarray]] | None = None,
                  is_audio_in_step: bool = False) -> list[list[np.ndarray]]:
    """A minimal engine loop: admit request i at step admit_at[i], then decode every admitted request each step.

    With `audio`, each step's frames are also decoded to audio in the engine's order: the codec call is left
    in flight while the next step's frames are queued, and only then collected (into `audio[request]`). The
    call is queued once the frames are back (`start_audio`), or, `is_audio_in_step`, by the frame step itself
    (`StepInput.audio_slots`)."""
    frames: list[list[np.ndarray]] = [[] for _ in requests]
    audio_in_flight: tuple[list[int | None], HostCopy] | None = None
    finished = [False] * len(requests)
    blocks: list[tuple[int, ...]] = []
    next_block = 0
    for request in requests:
        needed = -(-(request.prompt.num_positions + request.params.max_new_frames) // BLOCK_SIZE)
        blocks.append(tuple(range(next_block, next_block + needed)))
        next_block += needed
    step = 0
    while not all(finished):
        prefills = tuple(PrefillInput(i, blocks[i], r.prompt, r.params) for i, r in enumerate(requests)
                         if admit_at[i] == step)
        decodes = []
        for i, request in enumerate(requests):
            if admit_at[i] < step and not finished[i]:
                index = len(frames[i])
                trailing = request.prompt.trailing_text_ids
                text = trailing[index - 1] if index - 1 < len(trailing) else pad_id
                decodes.append(DecodeInput(i, blocks[i], request.prompt.num_positions + index - 1, index, text))
        audio_slots: frozenset[int] = frozenset()
        restarts: tuple[AudioRestart, ...] = ()
        if audio is not None and is_audio_in_step:
            no_context = np.zeros((0, runner.num_groups), dtype=np.int64)
            restarts = tuple(AudioRestart(p.slot, no_context) for p in prefills)
            audio_slots = frozenset([p.slot for p in prefills] + [d.slot for d in decodes])
        pending = runner.start_step(StepInput(prefills, tuple(decodes), audio_slots, restarts))
        if audio_in_flight is not None:
            _collect_audio(audio_in_flight, audio)
            audio_in_flight = None
        output = pending.result()
        made = [(p.slot, f) for p, f in zip(prefills, output.prefill_frames, strict=True)]
        made += [(d.slot, f) for d, f in zip(decodes, output.decode_frames, strict=True)]
        kept = []
        for slot, frame in made:
            if frame[0] == runner.model.config.talker.codec_eos_id:
                finished[slot] = True
                continue
            frames[slot].append(frame)
            finished[slot] = len(frames[slot]) == requests[slot].params.max_new_frames
            kept.append((slot, frame))
        if is_audio_in_step and pending.audio is not None:
            kept_slots = {slot for slot, _ in kept}  # an EOS frame's audio is dropped
            audio_in_flight = [slot if slot in kept_slots else None for slot in pending.audio_slots], pending.audio
        elif audio is not None and kept:
            slots = [slot for slot, _ in kept]
            if started := [slot for slot in slots if len(frames[slot]) == 1]:
                runner.reset_audio(started)
            audio_in_flight = slots, runner.start_audio(slots, np.stack([frame for _, frame in kept])[:, None])
        step += 1
    if audio_in_flight is not None:
        _collect_audio(audio_in_flight, audio)
    return frames


def _collect_audio(in_flight: tuple[list[int | None], HostCopy], audio: list[list[np.ndarray]] | None) -> None:
    slots, pending = in_flight
    assert audio is not None
    for slot, samples in zip(slots, pending.result(), strict=True):
        if slot is not None:
            audio[slot].append(samples)


def one_shot_audio(model, frames: list[np.ndarray]) -> np.ndarray:
    """The codec over a whole stream of frames at once."""
    with torch.inference_mode():
        codes = torch.from_numpy(np.stack(frames)).to(model.device).T[None]
        return model.codec_decoder(codes)[0, 0].float().cpu().numpy()


def assert_audio_in_flight_equals_one_shot(model, runner: ModelRunner, atol: float,
                                           is_audio_in_step: bool = False) -> None:
    """Three staggered requests, each step's audio decoded while the next step's frames run (as the engine
    does): every stream's chunks together equal its frames decoded in one call, within `atol`."""
    audio: list[list[np.ndarray]] = [[], [], []]
    frames = run_staggered(runner, requests_for(model, [9, 14, 11]), [0, 3, 5], model.config.tts_pad_token_id,
                           audio, is_audio_in_step)
    for stream_frames, chunks in zip(frames, audio, strict=True):
        assert len(chunks) == len(stream_frames)
        np.testing.assert_allclose(np.concatenate(chunks), one_shot_audio(model, stream_frames), atol=atol)


@pytest.mark.parametrize("is_audio_in_step", [False, True], ids=["after-the-frames", "in-the-frame-step"])
def test_audio_left_in_flight_while_the_next_frames_run_equals_the_whole_stream_decoded_at_once(
        tiny_models, is_audio_in_step: bool) -> None:
    model = tiny_models["custom_voice"]
    runner = ModelRunner(model, runner_config(model, num_kv_blocks=64, max_positions_per_request=256))
    assert_audio_in_flight_equals_one_shot(model, runner, atol=1e-5, is_audio_in_step=is_audio_in_step)


def test_the_frame_step_decodes_audio_for_its_audio_slots_alone_in_row_order(tiny_models) -> None:
    """Decodes first, then prefills, as the frame rows are laid out; a slot not asked for is left to the caller."""
    model = tiny_models["custom_voice"]
    runner = ModelRunner(model, runner_config(model, num_kv_blocks=64, max_positions_per_request=256))
    requests = requests_for(model, [4, 4, 4])
    blocks = [tuple(range(index * 16, index * 16 + 16)) for index in range(3)]
    first = runner.start_step(StepInput((PrefillInput(2, blocks[2], requests[2].prompt, requests[2].params),),
                                        audio_slots=frozenset({2})))
    frame = first.result().prefill_frames[0]
    assert first.audio_slots == (2,) and first.audio is not None
    reference = ModelRunner(model, runner_config(model, num_kv_blocks=8, max_positions_per_request=32))
    np.testing.assert_allclose(first.audio.result(), reference.decode_audio([0], frame[None, None]), atol=1e-6)
    decode = DecodeInput(2, blocks[2], requests[2].prompt.num_positions, 1, model.config.tts_pad_token_id)
    prefills = tuple(PrefillInput(slot, blocks[slot], requests[slot].prompt, requests[slot].params)
                     for slot in (1, 0))
    second = runner.start_step(StepInput(prefills, (decode,), audio_slots=frozenset({0, 2})))
    second.result()
    assert second.audio_slots == (2, 0) and second.audio is not None
    assert second.audio.result().shape == (2, model.speech_config.samples_per_frame)
    assert runner.start_step(StepInput((), (replace(decode, position=decode.position + 1, frame_index=2),))).audio \
        is None


@pytest.mark.parametrize("admit_at", [[0, 0, 0], [0, 3, 5]])
def test_runner_frames_equal_eager_generate(admit_at: list[int], tiny_models) -> None:
    model = tiny_models["custom_voice"]
    requests = requests_for(model, [9, 14, 11])
    expected = generate_codes(model.talker, requests, model.config.tts_pad_token_id)
    runner = ModelRunner(model, runner_config(model, num_kv_blocks=64, max_positions_per_request=256))
    frames = run_staggered(runner, requests, admit_at, model.config.tts_pad_token_id)
    for got, want in zip(frames, expected, strict=True):
        assert len(got) == want.codes.shape[0]
        assert torch.equal(torch.from_numpy(np.stack(got)), want.codes)


def test_streamed_audio_through_slots_equals_one_shot_decode(tiny_models) -> None:
    model = tiny_models["custom_voice"]
    runner = ModelRunner(model, runner_config(model, num_kv_blocks=8, max_positions_per_request=32))
    generator = torch.Generator().manual_seed(5)
    codes = torch.randint(0, 2048, (2, 11, 16), generator=generator)
    runner.reset_audio([1, 3])
    pieces = [runner.decode_audio([1, 3], codes[:, start:end].numpy()) for start, end in ((0, 1), (1, 3), (3, 11))]
    streamed = np.concatenate(pieces, axis=1)
    with torch.inference_mode():
        one_shot = model.codec_decoder(codes.transpose(1, 2))[:, 0].numpy()
    assert np.abs(streamed - one_shot).max() <= 1e-4


def test_a_restart_whose_context_fails_is_reported_by_slot_and_the_step_serves_the_rest(tiny_models) -> None:
    """A stream restarts with its context before the step's audio continues it; a context with a code outside the
    codec fails that stream alone."""
    model = tiny_models["custom_voice"]
    requests = requests_for(model, [3, 3, 3])
    runner = ModelRunner(model, runner_config(model, num_kv_blocks=64, max_positions_per_request=256))
    reference = ModelRunner(model, runner_config(model, num_kv_blocks=64, max_positions_per_request=256))
    context = np.random.default_rng(3).integers(0, 2048, (2, runner.num_groups))
    bad_context = context.copy()
    bad_context[1, 4] = 5000
    prefills = tuple(PrefillInput(slot, tuple(range(slot * 16, slot * 16 + 16)), requests[slot].prompt,
                                  requests[slot].params) for slot in (0, 1))
    pending = runner.start_step(StepInput(prefills, audio_slots=frozenset({0, 1}),
                                          restarts=(AudioRestart(0, context), AudioRestart(1, bad_context))))
    frames = pending.result().prefill_frames
    assert set(pending.failed_restarts) == {1} and "outside the codec" in pending.failed_restarts[1]
    assert frames.shape == (2, runner.num_groups) and pending.audio is not None
    reference.reset_audio([0])
    reference.prime_audio([0], context[None])
    np.testing.assert_allclose(pending.audio.result()[0], reference.decode_audio([0], frames[:1, None])[0], atol=1e-5)


def test_a_prefill_with_a_bad_voice_fails_alone_and_the_step_serves_the_rest(tiny_models) -> None:
    model = tiny_models["base"]
    hidden = model.config.talker.layers.hidden_size
    prompt = EagerSynthesizer(model).prompts.build(
        SynthesisInput("Hello there.", "english", clone=VoiceClone(speaker_embedding=None, reference_codes=None)))
    greedy = GenerationParams(talker=SamplingParams(0.0), predictor=SamplingParams(0.0), max_new_frames=4)
    voice = torch.linspace(-1, 1, hidden)
    # An x-vector prompt with its vector, with one of the wrong width, and with none.
    embeddings: list[torch.Tensor | None] = [voice, torch.ones(hidden + 3), None]
    runner = ModelRunner(model, runner_config(model))
    prefills = tuple(PrefillInput(slot, tuple(range(slot * 16, slot * 16 + 16)), prompt, greedy,
                                  speaker_embedding=embedding) for slot, embedding in enumerate(embeddings))
    output = runner.execute(StepInput(prefills))
    assert sorted(output.failed_prefills) == [1, 2]
    assert "speaker" in output.failed_prefills[2]
    (frame,) = output.prefill_frames
    want = generate_codes(model.talker, [GenerationRequest(prompt, greedy, voice)], model.config.tts_pad_token_id)
    assert np.array_equal(frame, want[0].codes[0].numpy())


def test_one_upload_carries_a_steps_ids_and_grows_past_its_buffer() -> None:
    staging = _IdStaging(torch.device("cpu"), num_ids=4)
    arrays = [np.arange(3), np.zeros(0, dtype=np.int64), np.arange(10, 16)]
    uploaded = staging.upload(arrays)
    assert [tensor.tolist() for tensor in uploaded] == [[0, 1, 2], [], [10, 11, 12, 13, 14, 15]]
    assert len(staging.buffers[0]) >= 9
    # The device copies are the step's own: staging the next steps (in either buffer) leaves them as they were.
    staging.upload([np.full(9, 7)])
    after = staging.upload([np.full(20, 8)])
    assert uploaded[2].tolist() == [10, 11, 12, 13, 14, 15] and after[0].tolist() == [8] * 20
    assert len(staging.buffers[0]) >= 20 and len(staging.buffers[1]) >= 9
