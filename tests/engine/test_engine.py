"""The asyncio engine on the tiny model: many concurrent requests, equal to the eager path."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from scheduler.request import FinishReason
from scheduler.scheduler import QueueFullError
from tests.engine.forced_ends import end_every_stream_at
from tts_service.eager.generate import GenerationRequest, generate_codes
from tts_service.eager.synthesize import EagerSynthesizer
from tts_service.engine.config import EngineConfig
from tts_service.engine.engine import Engine
from tts_service.engine.streams import RequestFailed, SynthesisRequest
from tts_service.model.prompts import PromptError, SynthesisInput
from tts_service.runner.params import GenerationParams, SamplingParams
from tts_service.runner.runner import StepInput

GREEDY = SamplingParams(0.0)
TEXTS = ["Hello there, how are you?", "Short.", "A longer sentence, so that prompts differ in length a lot.",
         "Numbers: 1, 2, 3.", "Why not?", "The quick brown fox jumps over the lazy dog."]
SPEAKERS = ["ryan", "eric", "serena"]


def make_engine(model, *, max_running: int = 4, num_slots: int = 6, num_kv_blocks: int = 128,
                max_waiting: int = 64, chunk_schedule: tuple[int, ...] = (1, 2, 4), clock=time.monotonic) -> Engine:
    """With one-frame chunks, every step that may be is scheduled ahead, however small the batch: these tests run
    the engine's pipelined path, the service's tests (the default, from 64 decodes) mostly the one in order."""
    config = EngineConfig(max_running=max_running, num_slots=num_slots, max_waiting=max_waiting, block_size=4,
                          num_kv_blocks=num_kv_blocks, max_positions_per_request=256,
                          codec_chunk_schedule=chunk_schedule, min_decodes_to_schedule_ahead=0)
    return Engine.create(model, config, clock)


def mixed_requests(count: int) -> list[tuple[SynthesisInput, GenerationParams]]:
    requests = []
    for index in range(count):
        synthesis = SynthesisInput(TEXTS[index % len(TEXTS)], "english" if index % 2 else "auto",
                                   SPEAKERS[index % len(SPEAKERS)], non_streaming_mode=index % 5 == 4)
        if index % 3 == 0:
            params = GenerationParams(talker=GREEDY, predictor=GREEDY, max_new_frames=6 + index)
        else:
            params = GenerationParams(talker=SamplingParams(0.8, top_k=20, top_p=0.9), seed=100 + index,
                                      repetition_penalty=1.0 + 0.1 * (index % 4), max_new_frames=5 + 2 * index)
        requests.append((synthesis, params))
    return requests


def eager_codes(model, requests: list[tuple[SynthesisInput, GenerationParams]]) -> list[torch.Tensor]:
    prompts = EagerSynthesizer(model).prompts
    batch = [GenerationRequest(prompts.build(s), p,
                               s.clone.speaker_embedding if s.clone is not None else None) for s, p in requests]
    return [generated.codes for generated in generate_codes(model.talker, batch, model.config.tts_pad_token_id)]


def one_shot_audio(model, codes: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return model.codec_decoder(torch.from_numpy(codes).T[None])[0, 0].numpy()


async def run_all(engine: Engine, requests: list[SynthesisRequest]):
    engine.start()
    try:
        streams = [await engine.submit(request) for request in requests]
        return await asyncio.gather(*(stream.collect() for stream in streams))
    finally:
        await engine.stop()


@pytest.mark.parametrize("chunk_schedule", [(1,), (1, 2, 4)])
def test_concurrent_requests_equal_eager_generation_and_stream_equal_offline_audio(
        tiny_models, chunk_schedule: tuple[int, ...]) -> None:
    model = tiny_models["custom_voice"]
    requests = mixed_requests(10)
    engine = make_engine(model, max_running=3, chunk_schedule=chunk_schedule)
    results = asyncio.run(run_all(engine, [SynthesisRequest(f"r{i}", s, p) for i, (s, p) in enumerate(requests)]))
    for (waveform, summary), want in zip(results, eager_codes(model, requests), strict=True):
        assert summary.finish_reason in (FinishReason.STOPPED, FinishReason.LENGTH)
        assert torch.equal(torch.from_numpy(summary.codes), want)
        assert waveform.shape == (summary.num_frames * model.speech_config.samples_per_frame,)
        if summary.num_frames:
            assert np.abs(waveform - one_shot_audio(model, summary.codes)).max() <= 1e-4
        assert summary.time_to_first_audio_s is None or summary.time_to_first_audio_s > 0
    assert engine.scheduler.num_kv_blocks_used == 0 and engine.scheduler.num_slots_used == 0
    stats = engine.stats
    assert stats.num_prefills == len(requests)
    assert stats.num_codec_frames == sum(summary.num_frames for _, summary in results)
    assert 0 < stats.execute_s <= stats.loop_s


def test_steps_scheduled_ahead_drop_the_frames_made_after_a_stream_ended_and_change_nothing_else(
        tiny_models) -> None:
    """Every stream ends by EOS at its frame 4, when the step after it has already been scheduled ahead and its
    frames made: those frames and their audio are dropped, and each stream's codes and audio are those of an
    engine that schedules every step in order."""
    model = tiny_models["custom_voice"]
    requests = [SynthesisRequest(f"r{i}", s, p) for i, (s, p) in enumerate(mixed_requests(8))]
    results = {}
    for schedule_ahead in (False, True):
        engine = make_engine(model, max_running=3, chunk_schedule=(1,))
        engine.min_decodes_to_schedule_ahead = 0 if schedule_ahead else None
        end_every_stream_at(engine.runner, 4, model.config.talker.codec_eos_id)
        results[schedule_ahead] = asyncio.run(run_all(engine, requests))
        assert (engine.stats.num_steps_ahead > 0) == schedule_ahead
        assert engine.scheduler.num_kv_blocks_used == 0 and engine.scheduler.num_slots_used == 0
    samples_per_frame = model.speech_config.samples_per_frame
    for (in_order_audio, in_order), (ahead_audio, ahead) in zip(results[False], results[True], strict=True):
        assert (ahead.finish_reason, ahead.num_frames) == (in_order.finish_reason, in_order.num_frames)
        assert np.array_equal(ahead.codes, in_order.codes)
        assert ahead_audio.shape == (ahead.num_frames * samples_per_frame,)
        np.testing.assert_allclose(ahead_audio, in_order_audio, atol=1e-5)
    assert sum(summary.finish_reason is FinishReason.STOPPED and summary.num_frames == 4
               for _, summary in results[True]) >= 4


@pytest.mark.parametrize("chunk_schedule", [(1,), (1, 2, 4)])
def test_preempted_requests_resume_with_identical_codes_and_audio(tiny_models,
                                                                  chunk_schedule: tuple[int, ...]) -> None:
    model = tiny_models["custom_voice"]
    requests = [(s, replace(p, max_new_frames=30, min_new_frames=30)) for s, p in mixed_requests(4)]
    prompts = EagerSynthesizer(model).prompts
    blocks_needed = [-(-(prompts.build(s).num_positions + 30) // 4) for s, _ in requests]
    # Room for the largest request and half of the rest: running all four at once must preempt.
    engine = make_engine(model, max_running=4,
                         num_kv_blocks=max(blocks_needed) + (sum(blocks_needed) - max(blocks_needed)) // 2,
                         chunk_schedule=chunk_schedule)
    results = asyncio.run(run_all(engine, [SynthesisRequest(f"r{i}", s, p) for i, (s, p) in enumerate(requests)]))
    assert engine.scheduler.num_preemptions_total > 0
    for (waveform, summary), want in zip(results, eager_codes(model, requests), strict=True):
        assert torch.equal(torch.from_numpy(summary.codes), want)
        assert np.abs(waveform - one_shot_audio(model, summary.codes)).max() <= 1e-4


async def feed(engine: Engine, request_id: str, fragments: list[str]) -> None:
    for fragment in fragments:
        engine.append_text(request_id, fragment)
        await asyncio.sleep(0.01)  # let the engine run steps between fragments, as an LLM would
    engine.close_text(request_id)


def test_text_arriving_in_fragments_gives_the_whole_text_codes(tiny_models) -> None:
    model = tiny_models["custom_voice"]
    text = "Streaming text arrives, one LLM token at a time; it'll still say 12.5 words."
    params = GenerationParams(talker=GREEDY, predictor=GREEDY, max_new_frames=40)
    synthesis = SynthesisInput(text, "english", "ryan")
    fragments = [text[i:i + 3] for i in range(0, len(text), 3)]

    async def scenario():
        engine = make_engine(model)
        engine.start()
        stream = await engine.submit(SynthesisRequest("open", replace(synthesis, text=""), params, is_text_open=True))
        await feed(engine, "open", fragments)
        result = await stream.collect()
        await engine.stop()
        return result

    _, summary = asyncio.run(scenario())
    want = eager_codes(model, [(synthesis, params)])[0]
    assert torch.equal(torch.from_numpy(summary.codes), want)
    assert summary.num_text_tokens == len(EagerSynthesizer(model).prompts.assistant_token_ids(text)[1])


def test_a_request_parked_for_text_does_not_hold_up_the_others(tiny_models) -> None:
    model = tiny_models["custom_voice"]
    params = GenerationParams(talker=GREEDY, predictor=GREEDY, max_new_frames=12, min_new_frames=12)
    open_input = SynthesisInput("", "english", "ryan")

    async def scenario():
        engine = make_engine(model)
        engine.start()
        parked = await engine.submit(SynthesisRequest("open", open_input, params, is_text_open=True))
        engine.append_text("open", "Hello there ")
        other = await engine.submit(SynthesisRequest("other", SynthesisInput("Good morning.", "auto", "eric"), params))
        _, other_summary = await other.collect()
        was_parked = engine.scheduler.num_parked == 1
        engine.append_text("open", "friend.")
        engine.close_text("open")
        _, parked_summary = await parked.collect()
        await engine.stop()
        return other_summary, parked_summary, was_parked

    other_summary, parked_summary, was_parked = asyncio.run(scenario())
    assert was_parked
    assert other_summary.finish_reason is FinishReason.LENGTH and other_summary.num_frames == 12
    assert parked_summary.finish_reason is FinishReason.LENGTH and parked_summary.num_frames == 12


def test_a_stream_whose_text_ran_dry_gives_its_slot_away_and_resumes_with_the_whole_text_codes(tiny_models) -> None:
    """One slot: the waiting request takes it from the stalled stream, which later resumes, recomputed, and
    says exactly what it would have said had it never stopped."""
    model = tiny_models["custom_voice"]
    text = "Hello there, my friend."
    params = GenerationParams(talker=GREEDY, predictor=GREEDY, max_new_frames=14, min_new_frames=14)
    synthesis = SynthesisInput(text, "english", "ryan")
    other_params = replace(params, max_new_frames=6, min_new_frames=6)

    async def scenario():
        engine = make_engine(model, max_running=1, num_slots=1)
        engine.start()
        stalled = await engine.submit(SynthesisRequest("open", replace(synthesis, text=""), params,
                                                       is_text_open=True))
        engine.append_text("open", "Hello there, ")
        first = await anext(stalled)  # it has spoken, and will stop for lack of text
        other = await engine.submit(SynthesisRequest("other", SynthesisInput("Good morning.", "auto", "eric"),
                                                     other_params))
        _, other_summary = await other.collect()
        num_preemptions = engine.scheduler.num_preemptions_total
        engine.append_text("open", "my friend.")
        engine.close_text("open")
        rest = [chunk async for chunk in stalled]
        await engine.stop()
        return first, rest, stalled.summary, other_summary, num_preemptions

    first, rest, summary, other_summary, num_preemptions = asyncio.run(scenario())
    assert num_preemptions >= 1 and other_summary.num_frames == 6
    assert torch.equal(torch.from_numpy(summary.codes), eager_codes(model, [(synthesis, params)])[0])
    waveform = np.concatenate([first.samples, *(chunk.samples for chunk in rest)])
    assert np.abs(waveform - one_shot_audio(model, summary.codes)).max() <= 1e-4


def test_abort_mid_stream_ends_that_stream_and_frees_its_memory(tiny_models) -> None:
    model = tiny_models["custom_voice"]
    long_params = GenerationParams(max_new_frames=200, min_new_frames=200, seed=1)
    short_params = GenerationParams(talker=GREEDY, predictor=GREEDY, max_new_frames=10)
    short_input = SynthesisInput("Good morning.", "auto", "eric")

    async def scenario():
        engine = make_engine(model)
        engine.start()
        doomed = await engine.submit(SynthesisRequest("doomed", SynthesisInput("Talk for a long time.", "auto", "ryan"),
                                                long_params))
        survivor = await engine.submit(SynthesisRequest("survivor", short_input, short_params))
        chunks = 0
        async for _ in doomed:
            chunks += 1
            if chunks == 2:
                engine.abort("doomed")
        result = await survivor.collect()
        await asyncio.sleep(0.05)
        idle_blocks = engine.scheduler.num_kv_blocks_used
        await engine.stop()
        return doomed.summary, result, idle_blocks

    doomed_summary, (_, survivor_summary), idle_blocks = asyncio.run(scenario())
    assert doomed_summary.finish_reason is FinishReason.ABORTED
    assert doomed_summary.num_frames < 200
    assert torch.equal(torch.from_numpy(survivor_summary.codes),
                       eager_codes(model, [(short_input, short_params)])[0])
    assert idle_blocks == 0


def in_context_clone_request(model) -> tuple[SynthesisInput, GenerationParams, Any]:
    """An in-context clone of a 2 s tone, greedy, 9 frames; and the eager synthesizer's result for it."""
    synthesizer = EagerSynthesizer(model)
    reference = np.sin(np.linspace(0, 400 * np.pi, 24000 * 2)).astype(np.float32) * 0.3
    clone = synthesizer.clone_voice(reference, "A reference sentence.", x_vector_only=False)
    synthesis = SynthesisInput("Cloned speech, streamed.", "english", clone=clone)
    params = GenerationParams(talker=GREEDY, predictor=GREEDY, max_new_frames=9, min_new_frames=9)
    return synthesis, params, synthesizer.synthesize([synthesis], [params])[0]


def test_in_context_clone_streams_the_eager_synthesizers_audio(tiny_models) -> None:
    model = tiny_models["base"]
    synthesis, params, expected = in_context_clone_request(model)
    engine = make_engine(model)
    [(waveform, summary)] = asyncio.run(run_all(engine, [SynthesisRequest("clone", synthesis, params)]))
    assert torch.equal(torch.from_numpy(summary.codes), expected.codes)
    assert np.abs(waveform - expected.waveform).max() <= 1e-4


def test_requests_in_one_clone_voice_decode_its_reference_frames_once_and_stream_the_same_audio(
        tiny_models, monkeypatch) -> None:
    """The codec state a clone's reference frames leave is kept (`PrimedVoices`): after the first request in a
    voice, the others start from it, to the eager synthesizer's audio all the same."""
    model = tiny_models["base"]
    synthesis, params, expected = in_context_clone_request(model)
    engine = make_engine(model, chunk_schedule=(1,))
    primed: list[list[int]] = []
    real_prime = engine.runner.prime_audio
    monkeypatch.setattr(engine.runner, "prime_audio", lambda slots, codes: (primed.append(slots),
                                                                             real_prime(slots, codes)))

    async def one_after_another():
        engine.start()
        results = []
        for index in range(3):
            stream = await engine.submit(SynthesisRequest(f"clone-{index}", synthesis, params))
            results.append(await stream.collect())
        await engine.stop()
        return results

    results = asyncio.run(one_after_another())
    assert len(primed) == 1 and engine.runner.primed_voices.num_hits == 2
    for waveform, summary in results:
        assert torch.equal(torch.from_numpy(summary.codes), expected.codes)
        assert np.abs(waveform - expected.waveform).max() <= 1e-4


def test_a_clone_whose_reference_frames_fail_to_decode_fails_alone_beside_one_that_needs_none(
        tiny_models, monkeypatch) -> None:
    """An in-context clone's stream starts by decoding its reference frames; when that fails, its request ends with
    the error, and an x-vector clone submitted with it streams on."""
    model = tiny_models["base"]
    synthesizer = EagerSynthesizer(model)
    reference = np.sin(np.linspace(0, 400 * np.pi, 24000 * 2)).astype(np.float32) * 0.3
    in_context = synthesizer.clone_voice(reference, "A reference sentence.", x_vector_only=False)
    x_vector = synthesizer.clone_voice(reference, None, x_vector_only=True)
    params = GenerationParams(talker=GREEDY, predictor=GREEDY, max_new_frames=5, min_new_frames=5)

    def failing_prime(slots, codes):
        raise RuntimeError("injected context fault")

    async def scenario():
        engine = make_engine(model, chunk_schedule=(1,))
        monkeypatch.setattr(engine.runner, "prime_audio", failing_prime)
        engine.start()
        failed = await engine.submit(SynthesisRequest(
            "in-context", SynthesisInput("Cloned speech.", "english", clone=in_context), params))
        served = await engine.submit(SynthesisRequest(
            "x-vector", SynthesisInput("Cloned speech.", "english", clone=x_vector), params))
        with pytest.raises(RequestFailed, match="audio decoding failed: RuntimeError: injected context fault"):
            await failed.collect()
        waveform, summary = await served.collect()
        await engine.stop()
        return engine, waveform, summary

    engine, waveform, summary = asyncio.run(scenario())
    assert summary.finish_reason is FinishReason.LENGTH and summary.num_frames == 5
    np.testing.assert_allclose(waveform, one_shot_audio(model, summary.codes), atol=1e-4)
    assert engine.scheduler.num_kv_blocks_used == 0 and engine.scheduler.num_slots_used == 0


def test_a_failed_step_fails_its_requests_and_the_engine_keeps_serving(tiny_models, monkeypatch) -> None:
    model = tiny_models["custom_voice"]
    params = GenerationParams(talker=GREEDY, predictor=GREEDY, max_new_frames=6)
    synthesis = SynthesisInput("Good morning.", "auto", "eric")

    async def scenario():
        engine = make_engine(model)
        original = engine.runner.start_step
        calls = {"count": 0}

        def flaky(step):
            calls["count"] += 1
            if calls["count"] == 3:
                raise RuntimeError("injected fault")
            return original(step)

        monkeypatch.setattr(engine.runner, "start_step", flaky)
        engine.start()
        victim = await engine.submit(SynthesisRequest("victim", synthesis, params))
        with pytest.raises(RequestFailed, match="injected fault"):
            await victim.collect()
        _, later = await (await engine.submit(SynthesisRequest("later", synthesis, params))).collect()
        await engine.stop()
        return victim.summary, later

    victim_summary, later = asyncio.run(scenario())
    assert victim_summary.finish_reason is FinishReason.ERROR
    assert torch.equal(torch.from_numpy(later.codes), eager_codes(model, [(synthesis, params)])[0])


def intercept_codec_calls(monkeypatch, runner, wrap) -> None:
    """Every codec call's pending samples go through wrap(slots, pending), whether the frame step queued the call
    (its audio slots) or `start_audio` did."""
    start_step, start_audio = runner.start_step, runner.start_audio

    def step(step_input):
        pending = start_step(step_input)
        if pending.audio is not None:
            pending.audio = wrap(list(pending.audio_slots), pending.audio)
        return pending

    monkeypatch.setattr(runner, "start_step", step)
    monkeypatch.setattr(runner, "start_audio", lambda slots, codes: wrap(slots, start_audio(slots, codes)))


def test_a_codec_call_that_fails_on_the_device_fails_its_stream_and_the_engine_keeps_serving(tiny_models,
                                                                                            monkeypatch) -> None:
    """The step's codec call is collected a step later; its failure then ends its stream with the error."""
    model = tiny_models["custom_voice"]
    params = GenerationParams(talker=GREEDY, predictor=GREEDY, max_new_frames=6, min_new_frames=6)
    synthesis = SynthesisInput("Good morning.", "auto", "eric")

    class FailedCopy:
        def result(self):
            raise RuntimeError("injected device fault")

    async def scenario():
        engine = make_engine(model, chunk_schedule=(1,))
        calls = {"count": 0}

        def flaky(slots, pending):
            calls["count"] += 1
            return FailedCopy() if calls["count"] == 3 else pending

        intercept_codec_calls(monkeypatch, engine.runner, flaky)
        engine.start()
        victim = await engine.submit(SynthesisRequest("victim", synthesis, params))
        with pytest.raises(RequestFailed, match="injected device fault"):
            await victim.collect()
        later_audio, later = await (await engine.submit(SynthesisRequest("later", synthesis, params))).collect()
        await engine.stop()
        return engine, victim.summary, later_audio, later

    engine, victim_summary, later_audio, later = asyncio.run(scenario())
    assert victim_summary.finish_reason is FinishReason.ERROR
    assert victim_summary.num_frames >= 2  # the frames before the failed call's
    assert later.finish_reason is FinishReason.LENGTH
    np.testing.assert_allclose(later_audio, one_shot_audio(model, later.codes), atol=1e-4)
    assert engine.scheduler.num_kv_blocks_used == 0 and engine.scheduler.num_slots_used == 0


def test_audio_that_comes_out_nan_fails_its_stream_alone_and_the_engine_keeps_serving(tiny_models,
                                                                                      monkeypatch) -> None:
    """An fp16 convolution that overflows poisons its row with NaNs: that stream fails saying so, and no NaN
    reaches a listener; the stream decoded beside it, and the requests after it, are unharmed."""
    model = tiny_models["custom_voice"]
    params = GenerationParams(talker=GREEDY, predictor=GREEDY, max_new_frames=6, min_new_frames=6)
    synthesis = SynthesisInput("Good morning.", "auto", "eric")

    class PoisonedCopy:
        def __init__(self, pending, row: int) -> None:
            self.pending, self.row = pending, row

        def result(self) -> np.ndarray:
            samples = self.pending.result()
            samples[self.row, 7] = np.nan
            return samples

    async def scenario():
        engine = make_engine(model, chunk_schedule=(1,))
        calls = {"count": 0}

        def poisoning(slots, pending):
            calls["count"] += 1
            # From the third call on, the first that decodes the victim's frames as well as another's: only the
            # victim's row is poisoned.
            victim = engine.scheduler.requests.get("victim")
            victim_slot = None if victim is None else victim.slot
            if calls["count"] >= 3 and not calls.get("poisoned") and victim_slot in slots and len(slots) > 1:
                calls["poisoned"] = True
                return PoisonedCopy(pending, slots.index(victim_slot))
            return pending

        intercept_codec_calls(monkeypatch, engine.runner, poisoning)
        engine.start()
        victim = await engine.submit(SynthesisRequest("victim", synthesis, params))
        neighbour = await engine.submit(SynthesisRequest("neighbour", synthesis, params))
        with pytest.raises(RequestFailed, match="non-finite samples"):
            await victim.collect()
        neighbour_audio, neighbour_summary = await neighbour.collect()
        later_audio, later = await (await engine.submit(SynthesisRequest("later", synthesis, params))).collect()
        await engine.stop()
        return engine, victim.summary, (neighbour_audio, neighbour_summary), (later_audio, later)

    engine, victim_summary, neighbour, later = asyncio.run(scenario())
    assert victim_summary.finish_reason is FinishReason.ERROR
    assert victim_summary.num_frames < 6  # it failed mid-stream
    for audio, summary in (neighbour, later):
        assert summary.finish_reason is FinishReason.LENGTH and np.isfinite(audio).all()
        np.testing.assert_allclose(audio, one_shot_audio(model, summary.codes), atol=1e-4)
    assert engine.scheduler.num_kv_blocks_used == 0 and engine.scheduler.num_slots_used == 0


def test_open_text_closed_without_words_fails_naming_the_text_field(tiny_models) -> None:
    model = tiny_models["custom_voice"]

    async def scenario():
        engine = make_engine(model)
        engine.start()
        stream = await engine.submit(SynthesisRequest("blank", SynthesisInput("", "auto", "ryan"), GenerationParams(),
                                                is_text_open=True))
        engine.append_text("blank", "   \n ")
        engine.close_text("blank")
        try:
            await stream.collect()
        finally:
            await engine.stop()

    with pytest.raises(PromptError) as caught:
        asyncio.run(scenario())
    assert caught.value.field == "text"


def test_a_full_queue_refuses_at_submit_and_keeps_the_queued(tiny_models) -> None:
    model = tiny_models["custom_voice"]
    params = GenerationParams(talker=GREEDY, predictor=GREEDY, max_new_frames=4)
    synthesis = SynthesisInput("Good morning.", "auto", "eric")

    async def scenario():
        engine = make_engine(model, max_running=1, max_waiting=1)
        engine.start()
        running = await engine.submit(SynthesisRequest("running", synthesis, params))
        first_chunk = await anext(running)  # admitted: it holds the one running place
        queued = await engine.submit(SynthesisRequest("queued", synthesis, params))
        with pytest.raises(QueueFullError):
            await engine.submit(SynthesisRequest("refused", synthesis, params))
        num_running_frames = first_chunk.num_frames + sum([chunk.num_frames async for chunk in running])
        _, queued_summary = await queued.collect()
        await engine.stop()
        return num_running_frames, queued_summary

    num_running_frames, queued_summary = asyncio.run(scenario())
    assert num_running_frames == queued_summary.num_frames == 4


class TickingClock:
    """Advances a fixed amount per reading, so a deadline falls after a fixed amount of engine work."""

    def __init__(self, tick: float) -> None:
        self.now = 0.0
        self.tick = tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


@pytest.mark.parametrize("deadline_after_s", [0.0, 0.5])
def test_a_passed_deadline_aborts_the_request_queued_or_decoding(tiny_models, deadline_after_s: float) -> None:
    model = tiny_models["custom_voice"]
    params = GenerationParams(max_new_frames=200, min_new_frames=200)

    async def scenario():
        clock = TickingClock(0.01)
        engine = make_engine(model, clock=clock)
        engine.start()
        stream = await engine.submit(SynthesisRequest("late", SynthesisInput("Hello.", "auto", "eric"), params,
                                                deadline=clock.now + deadline_after_s))
        _, summary = await stream.collect()
        await engine.stop()
        return summary

    summary = asyncio.run(scenario())
    assert summary.finish_reason is FinishReason.ABORTED
    if deadline_after_s == 0.0:
        assert summary.num_frames == 0
    else:
        assert 0 < summary.num_frames < 200


def test_the_step_profiler_times_every_phase_only_when_it_is_on(tiny_models) -> None:
    model = tiny_models["custom_voice"]
    params = GenerationParams(talker=GREEDY, predictor=GREEDY, max_new_frames=6, min_new_frames=6)
    synthesis = SynthesisInput("Good morning.", "auto", "eric")

    async def run(profile_steps: bool) -> dict[str, float]:
        config = EngineConfig(max_running=4, block_size=4, num_kv_blocks=64, max_positions_per_request=256,
                              codec_chunk_schedule=(1, 2, 4), profile_steps=profile_steps)
        engine = Engine.create(model, config)
        engine.start()
        await (await engine.submit(SynthesisRequest("profiled", synthesis, params))).collect()
        await engine.stop()
        return engine.stats.phase_s

    assert asyncio.run(run(profile_steps=False)) == {}
    phases = asyncio.run(run(profile_steps=True))
    host = {"schedule", "plan", "launch", "codec", "frames", "step_audio", "update"}
    device = {"device_prefill_inputs", "device_prefill", "device_decode", "device_copy", "device_codec"}
    queueing = {"queue_prefill_inputs", "queue_prefill", "queue_decode", "queue_copy", "queue_codec"}
    assert set(phases) == host | device | queueing
    assert all(seconds > 0 for seconds in phases.values())
    # The device's frame work happens between queueing the step and the end of the wait for its frames.
    assert phases["device_decode"] + phases["device_prefill"] <= phases["launch"] + phases["codec"] + phases["frames"]
    # Queueing the frames' work is a part of queueing the step; the codec's is queued after the frames are back.
    assert sum(phases[name] for name in queueing - {"queue_codec"}) <= phases["launch"]
    assert phases["queue_codec"] <= phases["launch"] + phases["step_audio"]


@pytest.mark.parametrize("max_new_frames", [1, 5])
def test_each_step_decodes_the_frames_it_made_in_the_frame_step_itself(tiny_models, max_new_frames: int) -> None:
    """With one-frame chunks, every stream's newest frame is decoded on the device right behind the frames, in
    the frame step's own codec call: nothing goes through `start_audio` after the frames reach the host."""
    model = tiny_models["custom_voice"]
    params = GenerationParams(talker=GREEDY, predictor=GREEDY, max_new_frames=max_new_frames,
                              min_new_frames=max_new_frames)
    requests = [SynthesisRequest(f"r{index}", SynthesisInput(text, "auto", "eric"), params)
                for index, text in enumerate(TEXTS[:3])]
    engine = make_engine(model, chunk_schedule=(1,))
    steps: list[tuple[StepInput, object]] = []
    runner = engine.runner
    start_step = runner.start_step

    def logged_step(step):
        pending = start_step(step)
        steps.append((step, pending))
        return pending

    def unexpected_audio(slots, codes):
        raise AssertionError("a chunk was decoded after its frames reached the host")

    runner.start_step, runner.start_audio = logged_step, unexpected_audio
    results = asyncio.run(run_all(engine, requests))
    assert len(steps) >= max_new_frames
    for step, pending in steps:
        # Every frame the step made is decoded (no frame is EOS: they all stop at the length limit), in row order.
        slots = tuple(item.slot for item in (*step.decodes, *step.prefills))
        assert step.audio_slots == frozenset(slots) and pending.audio_slots == slots
    for audio, summary in results:
        assert summary.finish_reason is FinishReason.LENGTH
        assert audio.shape == (max_new_frames * model.speech_config.samples_per_frame,)
        np.testing.assert_allclose(audio, one_shot_audio(model, summary.codes), atol=1e-4)
        assert summary.timeline.first_frame <= summary.timeline.first_audio
