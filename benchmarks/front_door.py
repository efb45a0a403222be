"""Benchmark: what the server's own process (the front door: gRPC, audio encoding, metrics, its side of the core's
socket) costs per call, on a CPU, with no model and no GPU.

The server is the real one, with its real engine-core process and wire; only the engine inside that process is a
stand-in (`benchmarks.paced_core`): every running request gets a frame of noise each step, a step lasting what the
1.7B (or, with --model-size, the 0.6B) model's frame step takes on an H100 at that many rows (BENCHMARKS.md, frame
step), and a request ends at the frames it asked for, as random weights do. The repository's load generator drives
it, open loop (mixed calls unless --rpc says). What is measured is the server process's CPU time over each load, per
call and per second of audio sent (the front door is one Python process, so its CPU per call bounds the request
rate one server can carry: BENCHMARKS.md, "Several GPUs behind one server"), and the objects the garbage collector
tracks per call in flight, which a full collection's pause grows with. Its first-audio figures are the front door's
and the wire's share only. A rate written with a w (20w) has every request ask for word timestamps, timed by the
stand-in (the server needs an --aligner-model).

    python -m benchmarks.front_door --rates 10,20,30 --duration 20 --out bench-results/front-door.json
    python -m benchmarks.front_door --rates 20,20w --server-flag=--aligner-model=random:tiny --out ...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import gzip
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from benchmarks.paced_core import FRAME_STEP_MS, RECORD_MODEL, run_paced_core, stood_in_model
from observability.gc_pauses import LOGGED_PAUSE_S, freeze_startup_objects, thaw_startup_objects, watch_pauses
from observability.logs import configure_logging
from tts_service.api.config import load_config
from tts_service.api.main import create_metrics
from tts_service.api.server import TtsServer
from tts_service.api.speech import CallTracker
from tts_service.engine import CoreSpec, EngineProcess


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class GcPauses:
    """Every garbage collection of this process while it is installed: generation and seconds."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((int(info.get("generation", -1)), time.perf_counter() - self._started))

    def summary(self) -> dict[str, Any]:
        long = [seconds for _, seconds in self.pauses if seconds >= LOGGED_PAUSE_S]
        return {"num_collections": len(self.pauses),
                "num_by_generation": {str(g): sum(1 for gen, _ in self.pauses if gen == g) for g in (0, 1, 2)},
                "num_over_5_ms": len(long), "max_ms": 1e3 * max((s for _, s in self.pauses), default=0.0)}


def process_cpu_seconds(pid: int) -> float:
    """A process's user and system CPU time so far (Linux's /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def load(port: int, rate: float, duration_s: float, rpc: str, out: Path, is_words: bool) -> dict[str, Any]:
    loadgen = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "clients.loadgen", "--server", f"127.0.0.1:{port}", "--rate", str(rate),
        "--duration", str(duration_s), "--rpc", rpc, "--seed", "1", "--out", str(out),
        *(["--word-timestamps"] if is_words else []), stdout=subprocess.DEVNULL)
    if await loadgen.wait() != 0:
        raise RuntimeError(f"the load generator failed at {rate} req/s")
    with gzip.open(out, "rt") as file:
        return cast(dict[str, Any], json.load(file)["summary"])


class HeldObjects:
    """What the calls in flight hold that the garbage collector walks: every `every_s`, the objects it tracks and
    the calls in progress, against the objects it tracks once the load has ended (`idle`). A full collection's
    pause grows with those objects (BENCHMARKS.md, "Garbage collection under load")."""

    def __init__(self, calls: CallTracker, every_s: float) -> None:
        self._calls = calls
        self._every_s = every_s
        self._samples: list[tuple[int, int]] = []
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(self._every_s, self._sample)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _sample(self) -> None:
        self._samples.append((len(gc.get_objects()), self._calls.num_active))
        self.start()

    def summary(self, idle: int) -> dict[str, Any]:
        per_call = [(tracked - idle) / in_flight for tracked, in_flight in self._samples if in_flight]
        return {"idle_tracked_objects": idle, "num_samples": len(per_call),
                "tracked_objects_per_call_in_flight": statistics.median(per_call) if per_call else None}


async def measured_load(port: int, core_pid: int, rate: str, duration_s: float, rpc: str, scratch: Path,
                        calls: CallTracker) -> dict[str, Any]:
    """One load at `rate` (req/s; with a w, 20w, every request asks for word timestamps): what the load generator saw,
    the CPU time the server's process and the core's took, and the objects its calls held."""
    pauses = GcPauses()
    held = HeldObjects(calls, every_s=max(duration_s / 10, 0.2))
    gc.callbacks.append(pauses)
    held.start()
    try:
        cpu, core_cpu = time.process_time(), process_cpu_seconds(core_pid)
        summary = await load(port, float(rate.removesuffix("w")), duration_s, rpc, scratch / f"{rate}.json.gz",
                             rate.endswith("w"))
        cpu, core_cpu = time.process_time() - cpu, process_cpu_seconds(core_pid) - core_cpu
    finally:
        held.stop()
        gc.callbacks.remove(pauses)
    gc.collect()
    idle = len(gc.get_objects())
    num_calls = summary["num_requests"]
    audio_s = summary["audio_s_per_wall_s"] * num_calls / summary["achieved_requests_per_s"]
    return {"rate": rate, "num_calls": num_calls, "num_completed": summary["num_completed"],
            "errors_by_status": summary["errors_by_status"], "audio_s": audio_s, "front_door_cpu_s": cpu,
            "front_door_cpu_ms_per_call": 1e3 * cpu / num_calls, "front_door_cpu_ms_per_audio_s": 1e3 * cpu / audio_s,
            "core_cpu_s": core_cpu, "ttfa_ms": summary["ttfa_ms"], "start_lag_ms": summary["start_lag_ms"],
            "num_requests_with_underruns": summary["num_requests_with_underruns"], "gc": pauses.summary(),
            "held_objects": held.summary(idle), "word_lag_ms": summary["word_lag_ms"]}


async def measure(rates: list[str], duration_s: float, rpc: str, size: str, server_flags: list[str]
                  ) -> list[dict[str, Any]]:
    """The server on a free port in front of the stand-in core, serving as `python -m tts_service` does (start-up
    objects frozen out of the collector's walks, long collections logged), and one measured load a rate."""
    port = free_port()
    config = load_config(["--model", RECORD_MODEL, "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
                          "--metrics-port", str(free_port()), "--max-calls-per-caller", "100000", *server_flags])
    configure_logging(config.log_level, config.log_format)
    server = TtsServer(config)
    await server.start()
    spec = CoreSpec(stood_in_model(size), "cpu", config.engine, config.log_level, config.log_format,
                    config.gil_switch_interval_ms / 1000, config.engine_stall_timeout_seconds)
    door: EngineProcess | None = None
    try:
        door = await EngineProcess.start(spec, target=run_paced_core)
        await door.warm_up()
    except BaseException:
        if door is not None:  # the server stops only a core it has served with
            await door.stop()
        await server.shutdown()
        raise
    assert door.pid is not None
    rows = []
    freeze_startup_objects()
    gc_watch = watch_pauses("server")
    try:
        await server.serve(door, create_metrics(config, door.model_info))
        with tempfile.TemporaryDirectory() as scratch:
            for rate in rates:
                row = await measured_load(port, door.pid, rate, duration_s, rpc, Path(scratch), server.calls)
                rows.append(row)
                sys.stdout.write(f"{rate:>6s} req/s: {row['num_calls']} calls, front door "
                                 f"{row['front_door_cpu_s']:6.2f} CPU s ({row['front_door_cpu_ms_per_call']:.2f} ms "
                                 f"a call), core {row['core_cpu_s']:.2f} CPU s, first audio p50 "
                                 f"{row['ttfa_ms']['p50']:.1f} p95 {row['ttfa_ms']['p95']:.1f} ms, underrunning "
                                 f"{row['num_requests_with_underruns']}, GC max {row['gc']['max_ms']:.1f} ms, "
                                 f"{_objects(row['held_objects'])} objects a call in flight\n")
    finally:
        await server.shutdown()
        gc.callbacks.remove(gc_watch)
        thaw_startup_objects()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.front_door", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="10,20,30",
                        help="request rates, one load each (req/s; 20w: every request asks for word timestamps)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load a rate")
    parser.add_argument("--rpc", choices=("online", "streaming", "mixed"), default="mixed",
                        help="the load generator's calls: SynthesizeOnline, StreamingSynthesize, or a random mix")
    parser.add_argument("--model-size", choices=sorted(FRAME_STEP_MS), default="1.7b",
                        help="whose frame step the stand-in core paces its steps by")
    parser.add_argument("--server-flag", action="append", default=[], dest="server_flags",
                        help="one more server flag (repeat), e.g. --server-flag=--max-concurrent=256")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    rates = args.rates.split(",")
    rows = asyncio.run(measure(rates, args.duration, args.rpc, args.model_size, args.server_flags))
    result = {"benchmark": "front_door", "date": time.strftime("%Y-%m-%d"), "cpu": _cpu_name(),
              "num_cpus": os.cpu_count(),
              "command": " ".join(["python -m benchmarks.front_door", *(argv or sys.argv[1:])]),
              "model_size": args.model_size, "frame_step_ms": FRAME_STEP_MS[args.model_size], "results": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


def _objects(held: dict[str, Any]) -> str:
    per_call = held["tracked_objects_per_call_in_flight"]
    return "no" if per_call is None else f"{per_call:.0f}"


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
