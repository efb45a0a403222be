"""Benchmark: what metrics and tracing cost the engine's frame step.

    python -m benchmarks.observability --model random:1.7b-custom_voice --out bench-results/observability.json

At each concurrency C, C requests at a time run closed-loop through one engine, alternately with
observation off and on, several rounds each. "On" is what the server does around every call:
the engine's step observer feeding the Prometheus metrics, a server span per request exported
over OTLP/gRPC (to a collector in this process that discards what it receives), the call's record
of chunks, and the request's metrics and span stage children at its end. The figure is the mean
engine step (schedule, execute, update) over each round, and the frames per second it delivered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from concurrent import futures
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import torch
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from benchmarks.engine import BENCH_TEXTS, frames_for_text
from observability.calls import CallRecord, CallResult
from observability.logs import bind_call
from observability.metrics import ServiceMetrics
from observability.tracing import CallTracer, provider_with
from tts_service.engine.config import EngineConfig
from tts_service.engine.engine import Engine
from tts_service.engine.streams import SynthesisRequest
from tts_service.model.checkpoint import LoadOptions
from tts_service.model.loading import load_model
from tts_service.model.prompts import SynthesisInput
from tts_service.runner.params import GenerationParams, SamplingParams


class DiscardingCollector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC endpoint that counts the spans it receives and keeps none."""

    def __init__(self) -> None:
        self.num_spans = 0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def Export(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.num_spans += sum(len(scope.spans) for spans in request.resource_spans for scope in spans.scope_spans)
        return trace_service_pb2.ExportTraceServiceResponse()


@dataclass
class Observation:
    metrics: ServiceMetrics
    tracer: CallTracer


async def one_request(engine: Engine, index: int, observation: Observation | None, frame_s: float) -> int:
    text = BENCH_TEXTS[index % len(BENCH_TEXTS)]
    num_frames = frames_for_text(text)
    params = GenerationParams(talker=SamplingParams(0.9, top_k=50), predictor=SamplingParams(0.9, top_k=50),
                              max_new_frames=num_frames, min_new_frames=num_frames, seed=index)
    request_id = f"r{index}-{time.monotonic_ns()}"
    record = CallRecord("SynthesizeOnline", request_id, num_text_chars=len(text))
    span = observation.tracer.start(record, ()) if observation is not None else None
    if observation is not None:
        bind_call(request_id, None)
    stream = await engine.submit(SynthesisRequest(request_id, SynthesisInput(text, "english", "ryan"), params))
    async for chunk in stream:
        if observation is not None:
            record.add_chunk(chunk.first_frame * frame_s)
    summary = stream.summary
    assert summary is not None
    if observation is not None and span is not None:
        record.result = CallResult(summary.finish_reason.value, summary.timeline, summary.num_frames,
                                   summary.num_text_tokens, summary.num_frames * frame_s)
        observation.metrics.observe_call(record, "OK")
        observation.tracer.end(span, record, "OK")
    return summary.num_frames


async def run_round(engine: Engine, concurrency: int, num_requests: int, observation: Observation | None,
                    frame_s: float) -> dict[str, float]:
    if observation is not None:
        engine.add_step_observer(observation.metrics.observe_step)
    gate = asyncio.Semaphore(concurrency)

    async def gated(index: int) -> int:
        async with gate:
            return await one_request(engine, index, observation, frame_s)

    before = replace(engine.stats)
    started = time.perf_counter()
    try:
        num_frames = sum(await asyncio.gather(*(gated(index) for index in range(num_requests))))
    finally:
        engine.remove_step_observer(observation.metrics.observe_step)
    wall_s = time.perf_counter() - started
    after = engine.stats
    num_steps = max(1, after.num_steps - before.num_steps)
    return {"step_ms_mean": (after.loop_s - before.loop_s) / num_steps * 1e3, "num_steps": num_steps,
            "frames_per_s": num_frames / wall_s}


async def run_benchmark(engine: Engine, levels: list[int], num_rounds: int, observation: Observation,
                        frame_s: float) -> list[dict[str, Any]]:
    engine.start()
    try:
        await run_round(engine, 1, 2, observation, frame_s)  # warm-up, observation's lazy set-up included
        results = []
        for concurrency in levels:
            rounds: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
            for _ in range(num_rounds):  # alternating, so that drift (clocks, allocator) hits both alike
                for mode in ("off", "on"):
                    rounds[mode].append(await run_round(engine, concurrency, 2 * concurrency,
                                                        observation if mode == "on" else None, frame_s))
            off = statistics.median(r["step_ms_mean"] for r in rounds["off"])
            on = statistics.median(r["step_ms_mean"] for r in rounds["on"])
            results.append({"concurrency": concurrency, "step_ms_off": off, "step_ms_on": on,
                            "overhead_pct": (on / off - 1) * 100,
                            "frames_per_s_off": statistics.median(r["frames_per_s"] for r in rounds["off"]),
                            "frames_per_s_on": statistics.median(r["frames_per_s"] for r in rounds["on"]),
                            "rounds": rounds})
        return results
    finally:
        await engine.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="random:1.7b-custom_voice", help="checkpoint directory or random:<preset>")
    parser.add_argument("--concurrency", default="1,64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    model = load_model(args.model, LoadOptions.default_for(args.device))
    engine = Engine.create(model, EngineConfig(max_running=max(levels), max_waiting=4 * max(levels),
                                               max_positions_per_request=1024))
    collector = DiscardingCollector()
    exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{collector.port}", insecure=True)
    tracer = CallTracer(provider_with(Resource.create({"service.name": "bench"}), BatchSpanProcessor(exporter)),
                        args.model, "custom_voice")
    metrics = ServiceMetrics(args.model, "custom_voice")
    frame_s = 1.0 / model.speech_config.frame_rate_hz
    results = asyncio.run(run_benchmark(engine, levels, args.rounds, Observation(metrics, tracer), frame_s))
    tracer.shutdown()
    collector.server.stop(grace=None)
    device = torch.cuda.get_device_name() if model.device.type == "cuda" else "cpu"
    report = {"benchmark": "observability", "device": device, "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "model": args.model,
              "command": " ".join(["python -m benchmarks.observability", *(argv or sys.argv[1:])]),
              "spans_received": collector.num_spans, "levels": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    lines = [f"{'conc':>5} {'step ms off':>12} {'step ms on':>11} {'overhead':>9} {'frames/s off':>13} "
             f"{'frames/s on':>12}"]
    lines += [f"{r['concurrency']:>5} {r['step_ms_off']:>12.3f} {r['step_ms_on']:>11.3f} {r['overhead_pct']:>8.2f}% "
              f"{r['frames_per_s_off']:>13.1f} {r['frames_per_s_on']:>12.1f}" for r in results]
    lines.append(f"spans received by the collector: {collector.num_spans}")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
