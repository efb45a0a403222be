"""Benchmark: how fast a barge-in frees its slot, through a running server. Each trial opens a StreamingSynthesize
call, speaks a long utterance with its text still open, and cancels it as soon as its first audio arrives; the
figure is the time from sending the cancel to receiving the utterance's completion (FINISH_REASON_CANCELLED),
which the server sends only once the engine has ended the request and given back its slot. Run it beside a load
(the load generator in another process) to see it under a realistic step time.

    python -m benchmarks.barge_in --server 127.0.0.1:50051 --trials 50 --out bench-results/barge_in.json
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from clients.loadgen.report import percentile
from clients.qwen3_tts_client import AudioFormat, CancelUtterance, Connection, Generation, Say, TtsClient, Voice
from clients.qwen3_tts_client import tts_pb2 as pb

TEXT = "This answer goes on for a long while, sentence after sentence, until the listener interrupts it "


def one_trial(client: TtsClient, voice: Voice) -> float:
    """Seconds from the cancel to the cancelled utterance's completion."""
    requests: queue.Queue[Any] = queue.Queue()
    requests.put(Say("turn", TEXT))

    def items() -> Iterator[Any]:
        while (item := requests.get()) is not None:
            yield item

    cancelled_at = None
    for response in client.streaming_synthesize(items(), voice, AudioFormat("pcm16"), Generation(), timeout=60,
                                                utterance_id="turn"):
        if cancelled_at is None and response.chunk.audio:
            cancelled_at = time.perf_counter()
            requests.put(CancelUtterance("turn"))
            requests.put(None)
        if response.HasField("completion"):
            if response.completion.finish_reason != pb.FINISH_REASON_CANCELLED:
                raise RuntimeError(f"the utterance ended {response.completion.finish_reason}, not cancelled")
            assert cancelled_at is not None
            return time.perf_counter() - cancelled_at
    raise RuntimeError("the call ended without the utterance's completion")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.barge_in", description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="127.0.0.1:50051")
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--speaker", default="ryan")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    voice = Voice(speaker=args.speaker, language="english")
    with TtsClient(Connection(target=args.server)) as client:
        one_trial(client, voice)  # warm the connection
        seconds = [one_trial(client, voice) for _ in range(args.trials)]
    p95 = percentile(seconds, 0.95)
    assert p95 is not None
    result = {"benchmark": "barge_in", "date": time.strftime("%Y-%m-%d"),
              "command": " ".join(["python -m benchmarks.barge_in", *(argv or sys.argv[1:])]),
              "cancel_to_completion_ms": {"p50": statistics.median(seconds) * 1e3, "p95": p95 * 1e3,
                                          "max": max(seconds) * 1e3, "num_trials": len(seconds)}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    sys.stdout.write(json.dumps(result["cancel_to_completion_ms"]) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
