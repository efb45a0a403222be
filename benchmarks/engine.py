"""Benchmark 2: time to first audio and real-time factor per request through the engine, in process.

    python -m benchmarks.engine --model random:1.7b-custom_voice --out bench-results/engine.json

At each concurrency C, 2C requests (at least 8; `--requests-per-level` sets another count) run closed-loop with
C in flight: a request starts as soon as one finishes, so arrivals overlap running streams as they would in
service. Texts come from a fixed set of 8; random weights never stop on their own, so each request's length is
fixed from its text (12.5 frames per second of speech at 15 characters per second). `--workload loadgen` takes
instead the requests the load generator's closed loop sends (`python -m clients.loadgen --concurrency C
--requests N --rpc online --seed S`): the same texts, languages and audio lengths, so that the service over gRPC
and the engine in process can be compared at one concurrency.

Per request: time to first audio (submit -> first chunk in the caller's hands), real-time factor
(submit -> last chunk, over the audio's duration) and lateness: with playback starting at the
first chunk, a chunk is late when it arrives after the moment its first sample must play.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from clients.loadgen.schedule import closed_loop_plan
from observability.gc_pauses import freeze_startup_objects
from tts_service.engine.config import EngineConfig
from tts_service.engine.engine import Engine, EngineStats
from tts_service.engine.streams import SynthesisRequest
from tts_service.model.checkpoint import LoadOptions
from tts_service.model.loading import load_model
from tts_service.model.prompts import SynthesisInput
from tts_service.runner.params import GenerationParams, SamplingParams

CHARACTERS_PER_SECOND = 15.0
FRAME_RATE_HZ = 12.5
BENCH_TEXTS = (
    "Hello, and welcome to the show.",
    "The weather today is mild, with a light breeze from the west and clear skies.",
    "Please hold while I transfer your call to the next available agent.",
    "Streaming speech lets a voice assistant start talking before it has finished thinking.",
    "One, two, three, four, five.",
    "In the beginning the universe was created. This has made a lot of people very angry and been widely "
    "regarded as a bad move.",
    "Your package will arrive on Thursday between nine and eleven in the morning.",
    "Thank you for listening.",
)


# The engine's own split of a request's first audio (RequestTiming's fields of the same names, in seconds).
FIRST_AUDIO_STAGES = ("queue", "prefill", "frame_to_audio")


def frames_for_text(text: str) -> int:
    return max(1, round(len(text) / CHARACTERS_PER_SECOND * FRAME_RATE_HZ))


@dataclass(frozen=True)
class BenchRequest:
    text_index: int  # in the workload's list of texts
    text: str
    language: str
    num_frames: int


def bench_workload(num_requests: int) -> list[BenchRequest]:
    """The fixed texts, in turn."""
    indices = [index % len(BENCH_TEXTS) for index in range(num_requests)]
    return [BenchRequest(index, BENCH_TEXTS[index], "english", frames_for_text(BENCH_TEXTS[index]))
            for index in indices]


def loadgen_workload(num_requests: int, seed: int) -> list[BenchRequest]:
    """What `python -m clients.loadgen --requests num_requests --rpc online --seed seed` sends, in its order. The
    load generator caps each call at its text's audio length, which the server rounds to whole frames."""
    return [BenchRequest(request.index, request.text, request.language,
                         max(1, round(request.max_audio_seconds * FRAME_RATE_HZ)))
            for request in closed_loop_plan(num_requests, "online", seed)]


@dataclass(frozen=True)
class RequestTiming:
    concurrency: int
    text_index: int
    num_frames: int
    audio_s: float
    time_to_first_audio_s: float
    total_s: float
    realtime_factor: float
    max_lateness_s: float  # > 0: the listener would have heard a gap
    # Where the engine's first audio went, from its own timeline: waiting for admission, the step that prefilled
    # it and sampled frame 0, then until frame 0's audio reached the stream (the next step's codec call).
    queue_s: float
    prefill_s: float
    frame_to_audio_s: float


async def timed_request(engine: Engine, index: int, concurrency: int, frame_s: float, request: BenchRequest,
                        non_streaming_text: bool = False) -> RequestTiming:
    request_id = f"c{concurrency}-{index}"
    num_frames = request.num_frames
    params = GenerationParams(talker=SamplingParams(0.9, top_k=50), predictor=SamplingParams(0.9, top_k=50),
                              max_new_frames=num_frames, min_new_frames=num_frames, seed=index)
    started = time.perf_counter()
    synthesis = SynthesisInput(request.text, request.language, "ryan", non_streaming_mode=non_streaming_text)
    stream = await engine.submit(SynthesisRequest(request_id, synthesis, params))
    first_audio = None
    max_lateness = float("-inf")
    async for chunk in stream:
        now = time.perf_counter()
        if first_audio is None:
            first_audio = now
        max_lateness = max(max_lateness, now - (first_audio + chunk.first_frame * frame_s))
    finished = time.perf_counter()
    summary = stream.summary
    assert summary is not None and first_audio is not None
    timeline = summary.timeline
    assert timeline.queue_s is not None and timeline.prefill_s is not None
    assert timeline.first_frame is not None and timeline.first_audio is not None
    audio_s = summary.num_frames * frame_s
    return RequestTiming(concurrency, request.text_index, summary.num_frames, audio_s, first_audio - started,
                         finished - started, (finished - started) / audio_s, max_lateness, timeline.queue_s,
                         timeline.prefill_s, timeline.first_audio - timeline.first_frame)


async def run_level(engine: Engine, concurrency: int, requests: list[BenchRequest], frame_s: float,
                    non_streaming_text: bool = False) -> list[RequestTiming]:
    gate = asyncio.Semaphore(concurrency)

    async def one(index: int, request: BenchRequest) -> RequestTiming:
        async with gate:
            return await timed_request(engine, index, concurrency, frame_s, request, non_streaming_text)

    return list(await asyncio.gather(*(one(index, request) for index, request in enumerate(requests))))


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def summarize(concurrency: int, timings: list[RequestTiming], wall_s: float) -> dict[str, float | int]:
    ttfa = [t.time_to_first_audio_s for t in timings]
    rtf = [t.realtime_factor for t in timings]
    return {
        "concurrency": concurrency, "num_requests": len(timings),
        "ttfa_p50_ms": percentile(ttfa, 0.5) * 1e3, "ttfa_p95_ms": percentile(ttfa, 0.95) * 1e3,
        "ttfa_p99_ms": percentile(ttfa, 0.99) * 1e3,
        "rtf_p50": statistics.median(rtf), "rtf_p95": percentile(rtf, 0.95), "rtf_max": max(rtf),
        "max_lateness_ms": max(t.max_lateness_s for t in timings) * 1e3,
        "num_requests_late": sum(t.max_lateness_s > 0 for t in timings),
        "audio_s_per_wall_s": sum(t.audio_s for t in timings) / wall_s,
        **{f"{stage}_p{round(fraction * 100)}_ms": percentile([getattr(t, f"{stage}_s") for t in timings],
                                                               fraction) * 1e3
           for stage in FIRST_AUDIO_STAGES for fraction in (0.5, 0.95)},
    }


def step_summary(before: EngineStats, after: EngineStats) -> dict[str, Any]:
    """Where the engine's time went over a level: per step, in the runner and in the loop around it, and with
    the step profiler on, per phase (host phases of the loop, device_* on the GPU)."""
    num_steps = max(1, after.num_steps - before.num_steps)
    phase_ms = {phase: (seconds - before.phase_s.get(phase, 0.0)) / num_steps * 1e3
                for phase, seconds in after.phase_s.items()}
    return {"num_steps": num_steps, "phase_ms_per_step": phase_ms,
            "step_ms_mean": (after.loop_s - before.loop_s) / num_steps * 1e3,
            "execute_ms_mean": (after.execute_s - before.execute_s) / num_steps * 1e3,
            "decode_batch_mean": (after.num_decoded_frames - before.num_decoded_frames) / num_steps,
            "codec_frames_per_step": (after.num_codec_frames - before.num_codec_frames) / num_steps,
            "prefills_per_step": (after.num_prefills - before.num_prefills) / num_steps,
            "num_eager_prefills": after.num_eager_prefills - before.num_eager_prefills,
            "num_steps_ahead": after.num_steps_ahead - before.num_steps_ahead}


async def run_benchmark(engine: Engine, levels: list[int], frame_s: float,
                        workload: Callable[[int], list[BenchRequest]] = bench_workload,
                        requests_per_level: int | None = None,
                        non_streaming_text: bool = False) -> tuple[list[dict], list[RequestTiming]]:
    """`workload(n)`: a level's n requests; n is `requests_per_level`, or 2C (at least 8) at concurrency C."""
    engine.start()
    try:
        # Warm-up: lazy initialisation, allocator growth.
        await run_level(engine, 1, bench_workload(2), frame_s, non_streaming_text)
        freeze_startup_objects()  # as the server does after its warm-up: no full collection walks the model's objects
        summaries, timings = [], []
        for concurrency in levels:
            started = time.perf_counter()
            before = replace(engine.stats, phase_s=dict(engine.stats.phase_s))
            num_requests = requests_per_level or max(8, 2 * concurrency)
            level = await run_level(engine, concurrency, workload(num_requests), frame_s, non_streaming_text)
            summary = summarize(concurrency, level, time.perf_counter() - started)
            summary.update(step_summary(before, engine.stats))
            summaries.append(summary)
            timings += level
        return summaries, timings
    finally:
        await engine.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="random:1.7b-custom_voice", help="checkpoint directory or random:<preset>")
    parser.add_argument("--concurrency", default="1,8,32,128")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--profile-steps", action="store_true",
                        help="time every step's phases (host and GPU) and report them per level")
    parser.add_argument("--non-streaming-text", action="store_true",
                        help="give the talker each whole text up front (qwen-tts's default for CustomVoice)")
    parser.add_argument("--codec-chunk-schedule", default=None,
                        help="frames per codec chunk, first chunks first (default: the engine's)")
    parser.add_argument("--codec-dtype", default="float32", choices=("float32", "bfloat16"),
                        help="the codec decoder's dtype (the engine's --codec-dtype)")
    parser.add_argument("--codec-convolution-dtype", default="auto", choices=("auto", "float32", "float16"),
                        help="what a float32 codec's convolutions read and write (the engine's option of that name)")
    parser.add_argument("--workload", choices=("bench", "loadgen"), default="bench",
                        help="bench: the 8 fixed texts; loadgen: the load generator's closed-loop requests")
    parser.add_argument("--min-decodes-to-schedule-ahead", default="64",
                        help="from this many decodes a step, schedule the next while it runs; 'off': never "
                             "(the engine's option of that name)")
    parser.add_argument("--no-predictor-kernel", action="store_true",
                        help="keep the code predictor's layer chain at one and two streams as well")
    parser.add_argument("--requests-per-level", type=int, help="default: 2C (at least 8) at concurrency C")
    parser.add_argument("--seed", type=int, default=1, help="the load generator's seed (--workload loadgen)")
    args = parser.parse_args(argv)
    if args.requests_per_level is not None and args.requests_per_level < 1:
        parser.error("--requests-per-level must be >= 1")
    levels = [int(c) for c in args.concurrency.split(",")]
    options = LoadOptions.default_for(args.device, args.codec_dtype, args.codec_convolution_dtype)
    model = load_model(args.model, options)
    started = time.perf_counter()
    schedule_ahead = None if args.min_decodes_to_schedule_ahead == "off" else int(args.min_decodes_to_schedule_ahead)
    schedule = {} if args.codec_chunk_schedule is None else {
        "codec_chunk_schedule": tuple(int(n) for n in args.codec_chunk_schedule.split(","))}
    engine = Engine.create(model, EngineConfig(max_running=max(levels), max_waiting=4 * max(levels),
                                               max_positions_per_request=1024, profile_steps=args.profile_steps,
                                               codec_dtype=args.codec_dtype,
                                               codec_convolution_dtype=args.codec_convolution_dtype,
                                               min_decodes_to_schedule_ahead=schedule_ahead,
                                               use_predictor_kernel=not args.no_predictor_kernel, **schedule))
    startup_s = time.perf_counter() - started
    frame_s = 1.0 / model.speech_config.frame_rate_hz
    workload = bench_workload if args.workload == "bench" else functools.partial(loadgen_workload, seed=args.seed)
    summaries, timings = asyncio.run(run_benchmark(engine, levels, frame_s, workload, args.requests_per_level,
                                                   args.non_streaming_text))
    device = torch.cuda.get_device_name() if model.device.type == "cuda" else "cpu"
    report = {"benchmark": "engine", "device": device, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "model": args.model, "dtype": str(engine.runner.dtype), "startup_s": startup_s,
              "non_streaming_text": args.non_streaming_text, "codec_dtype": args.codec_dtype,
              "codec_convolution_dtype": args.codec_convolution_dtype,
              "codec_half_convolutions": options.codec_half_convolutions,
              "min_decodes_to_schedule_ahead": schedule_ahead,
              "command": " ".join(["python -m benchmarks.engine", *(argv or sys.argv[1:])]),
              "workload": args.workload, "seed": args.seed if args.workload == "loadgen" else None,
              "texts": list(BENCH_TEXTS) if args.workload == "bench" else None, "levels": summaries,
              "requests": [asdict(t) for t in timings]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    header = (f"{'conc':>5} {'reqs':>5} {'ttfa p50':>9} {'ttfa p95':>9} {'rtf p50':>8} {'rtf max':>8} "
              f"{'late ms':>8} {'late':>5} {'audio s/s':>10} {'step ms':>8} {'exec ms':>8} {'batch':>6} "
              f"{'eager':>6}")
    lines = [header] + [f"{s['concurrency']:>5} {s['num_requests']:>5} {s['ttfa_p50_ms']:>9.1f} "
                        f"{s['ttfa_p95_ms']:>9.1f} {s['rtf_p50']:>8.3f} {s['rtf_max']:>8.3f} "
                        f"{s['max_lateness_ms']:>8.1f} {s['num_requests_late']:>5} "
                        f"{s['audio_s_per_wall_s']:>10.1f} {s['step_ms_mean']:>8.1f} {s['execute_ms_mean']:>8.1f} "
                        f"{s['decode_batch_mean']:>6.1f} {s['num_eager_prefills']:>6}" for s in summaries]
    lines += [f"{s['concurrency']:>5} first audio p50/p95 ms: " + ", ".join(
        f"{stage} {s[f'{stage}_p50_ms']:.1f}/{s[f'{stage}_p95_ms']:.1f}" for stage in FIRST_AUDIO_STAGES)
        for s in summaries]
    lines += [f"{s['concurrency']:>5} phases ms/step: " + ", ".join(f"{phase} {ms:.2f}" for phase, ms in
                                                                   s["phase_ms_per_step"].items())
              for s in summaries if s["phase_ms_per_step"]]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
