"""python -m clients.loadgen: see the package docstring."""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import grpc

from clients.loadgen.processes import run_schedule_in_processes
from clients.loadgen.report import summarize, table
from clients.loadgen.run import RequestSettings, run_closed_loop, run_schedule
from clients.loadgen.schedule import PlannedRequest, closed_loop_plan, poisson_schedule
from clients.qwen3_tts_client import AsyncTtsClient, AudioFormat, Connection, Generation, Voice


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m clients.loadgen",
                                     description="Open-loop Poisson load over gRPC streaming calls (or a closed "
                                                 "loop, to measure the service's ceiling).")
    parser.add_argument("--server", default="localhost:50051")
    load = parser.add_mutually_exclusive_group(required=True)
    load.add_argument("--rate", type=float, help="mean arrivals per second (open loop; needs --duration)")
    load.add_argument("--concurrency", type=int,
                      help="requests kept in flight, each sent as soon as one ends (closed loop; needs --requests)")
    parser.add_argument("--duration", type=float, help="seconds over which requests arrive (open loop)")
    parser.add_argument("--requests", type=int, help="requests to send in all (closed loop)")
    parser.add_argument("--rpc", choices=("online", "streaming", "mixed"), default="mixed",
                        help="SynthesizeOnline, StreamingSynthesize, or a random mix")
    voice = parser.add_mutually_exclusive_group()
    voice.add_argument("--speaker", help="a CustomVoice model's speaker (default: ryan)")
    voice.add_argument("--voice-id", help="a registered voice for every request (Base models; qwen3-tts voice create)")
    voice.add_argument("--reference-audio", type=Path,
                       help="a recording sent inline with every request, its voice cloned (Base models)")
    parser.add_argument("--reference-text", default="",
                        help="the transcript of --reference-audio (an in-context clone; without it, x-vector only)")
    parser.add_argument("--language", choices=("english", "chinese"),
                        help="only texts in this language (default: the whole set, each in its own language)")
    parser.add_argument("--encoding", default="pcm16")
    parser.add_argument("--sample-rate", type=int, default=0, help="0: the model's 24000 Hz")
    parser.add_argument("--max-audio-seconds", type=float,
                        help="cap on each request's audio, under the server's own limit, which always applies")
    parser.add_argument("--temperature", type=float, help="unset: the model's default")
    parser.add_argument("--fragment-interval", type=float, default=0.0,
                        help="StreamingSynthesize: seconds between text fragments (0: as fast as possible)")
    parser.add_argument("--timeout", type=float, default=300.0, help="per-call deadline in seconds")
    parser.add_argument("--word-timestamps", action="store_true",
                        help="ask every request for word timestamps (the server needs --aligner-model) and report "
                             "how long each message of words trails the audio of its last word")
    parser.add_argument("--processes", type=int, default=1,
                        help="worker processes sharing the open loop's schedule, for rates one process cannot send "
                             "and read (its lag behind the schedule says when)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--api-key", default="")
    parser.add_argument("--ca", help="PEM CA bundle: connect with TLS")
    parser.add_argument("--out", type=Path, required=True, help="report file; gzip-compressed if it ends in .gz")
    return parser


def _voice(args: argparse.Namespace) -> Voice:
    if args.voice_id:
        return Voice(voice_id=args.voice_id)
    if args.reference_audio:
        return Voice(reference_audio=args.reference_audio.read_bytes(), reference_text=args.reference_text,
                     x_vector_only=not args.reference_text)
    return Voice(speaker=args.speaker or "ryan")


def _plan(args: argparse.Namespace, limits: Any) -> list[PlannedRequest]:
    """The requests to send, each inside the server's `limits` (ListVoices' Limits): one past them would be refused,
    and count as an error of the server's."""
    max_audio_seconds = limits.max_audio_seconds if args.max_audio_seconds is None else min(
        args.max_audio_seconds, limits.max_audio_seconds)
    if args.rate is not None:
        return poisson_schedule(args.rate, args.duration, args.rpc, args.seed, max_audio_seconds, args.language,
                                limits.max_text_chars)
    return closed_loop_plan(args.requests, args.rpc, args.seed, max_audio_seconds, args.language,
                            limits.max_text_chars)


async def _run(args: argparse.Namespace) -> dict:
    voice = _voice(args)
    settings = RequestSettings(voice=voice,
                               audio_format=AudioFormat(args.encoding, args.sample_rate),
                               generation=Generation(temperature=args.temperature, seed=args.seed),
                               fragment_interval_s=args.fragment_interval, timeout_s=args.timeout,
                               word_timestamps=args.word_timestamps)
    connection = Connection(target=args.server, api_key=args.api_key,
                            root_certificates=Path(args.ca).read_bytes() if args.ca else None)
    async with AsyncTtsClient(connection) as client:
        limits = (await client.list_voices(timeout=args.timeout)).limits
        planned = _plan(args, limits)
        started = time.perf_counter()
        if args.processes > 1:
            records = await asyncio.to_thread(run_schedule_in_processes, connection, planned, settings,
                                              args.processes)
        elif args.rate is not None:
            records = await run_schedule(client, planned, settings)
        else:
            records = await run_closed_loop(client, planned, settings, args.concurrency)
        wall_s = time.perf_counter() - started
    return {"benchmark": "loadgen", "date": time.strftime("%Y-%m-%d %H:%M:%S"), "server": args.server,
            "command": " ".join(["python -m clients.loadgen", *sys.argv[1:]]),
            "settings": {"rate": args.rate, "duration_s": args.duration, "concurrency": args.concurrency,
                         "num_requests": args.requests, "rpc": args.rpc, "seed": args.seed,
                         "language": args.language, "encoding": args.encoding, "sample_rate": args.sample_rate,
                         "fragment_interval_s": args.fragment_interval, "max_audio_seconds": args.max_audio_seconds,
                         "word_timestamps": args.word_timestamps, "processes": args.processes,
                         "speaker": voice.speaker, "voice_id": voice.voice_id,
                         "reference_audio": str(args.reference_audio or ""), "reference_text": voice.reference_text,
                         "server_limits": {"max_audio_seconds": limits.max_audio_seconds,
                                           "max_text_chars": limits.max_text_chars}},
            "schedule": [asdict(request) for request in planned], "wall_s": wall_s,
            "summary": summarize(records, wall_s), "requests": [asdict(record) for record in records]}


def write_report(path: Path, report: dict) -> None:
    """JSON, gzip-compressed when the name ends in .gz: a run's per-request records take megabytes as text."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as file:
            json.dump(report, file)
    else:
        path.write_text(json.dumps(report, indent=2))


def read_report(path: Path) -> dict:
    """A report `write_report` wrote, compressed or not."""
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as file:
            return json.load(file)
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.rate is not None and args.duration is None:
        parser.error("--rate needs --duration")
    if args.concurrency is not None and args.requests is None:
        parser.error("--concurrency needs --requests")
    if args.processes < 1 or (args.processes > 1 and args.rate is None):
        parser.error("--processes must be 1 or more, and more than 1 only with --rate")
    try:
        report = asyncio.run(_run(args))
    except grpc.aio.AioRpcError as error:  # ListVoices, before any load: each request catches its own
        parser.exit(1, f"{parser.prog}: cannot read the server's limits: {error.code().name}: {error.details()}\n")
    write_report(args.out, report)
    load = f"{args.rate:g}" if args.rate is not None else f"c{args.concurrency}"
    sys.stdout.write(table(load, report["summary"]) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
