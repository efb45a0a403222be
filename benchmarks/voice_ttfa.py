"""Benchmark: time to first audio of an in-context voice clone named by its registered voice id, against the same
clone sent with its reference audio in every request, through a running server (one request at a time).

    python -m benchmarks.voice_ttfa --server 127.0.0.1:50051 --out bench-results/voice_ttfa.json

The server must load a Base (voice clone) model. Requests alternate between the two ways, so that drift in the
machine's state falls on both alike. Time to first audio runs from the call's start to the first response message
that carries audio, as a client sees it.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from clients.loadgen.report import percentile
from clients.qwen3_tts_client import AudioFormat, Connection, Generation, TtsClient, Voice, VoiceReference

REFERENCE_RATE = 24000
REFERENCE_TEXT = "This is the reference recording that the registered voice was cloned from, read at an even pace."
TEXT = "Good morning, and thank you for calling."


def reference_wav(seconds: float, seed: int = 0) -> bytes:
    """A voice-like test signal (a gliding tone with harmonics and a little noise) as a 24 kHz WAV file."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * REFERENCE_RATE)) / REFERENCE_RATE
    pitch = 140.0 + 40.0 * np.sin(2 * np.pi * 0.5 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / REFERENCE_RATE
    signal = sum(np.sin(k * phase) / k for k in range(1, 6)) * 0.2 + 0.01 * rng.standard_normal(t.size)
    buffer = io.BytesIO()
    sf.write(buffer, signal.astype(np.float32), REFERENCE_RATE, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def time_to_first_audio(client: TtsClient, voice: Voice, generation: Generation) -> float:
    started = time.perf_counter()
    first = None
    for response in client.synthesize_online(TEXT, voice, AudioFormat("pcm16"), generation, timeout=120):
        if first is None and response.chunk.audio:
            first = time.perf_counter() - started
    if first is None:
        raise RuntimeError("the server sent no audio")
    return first


def summary(seconds: list[float]) -> dict[str, float]:
    p95 = percentile(seconds, 0.95)
    assert p95 is not None
    return {"p50_ms": statistics.median(seconds) * 1e3, "p95_ms": p95 * 1e3,
            "mean_ms": statistics.fmean(seconds) * 1e3, "num_requests": len(seconds)}


def run(server: str, iterations: int, reference_seconds: float, max_audio_seconds: float) -> dict[str, Any]:
    reference = reference_wav(reference_seconds)
    generation = Generation(seed=1, max_audio_seconds=max_audio_seconds)
    with TtsClient(Connection(target=server)) as client:
        model = client.list_voices(timeout=60).model
        started = time.perf_counter()
        registered = client.create_voice(VoiceReference(audio=reference, text=REFERENCE_TEXT), timeout=120)
        create_s = time.perf_counter() - started
        inline = Voice(reference_audio=reference, reference_text=REFERENCE_TEXT)
        by_id = Voice(voice_id=registered.voice_id)
        times: dict[str, list[float]] = {"by_voice_id": [], "reference_audio_inline": []}
        time_to_first_audio(client, by_id, generation)  # warm both paths before timing
        time_to_first_audio(client, inline, generation)
        for _ in range(iterations):
            times["by_voice_id"].append(time_to_first_audio(client, by_id, generation))
            times["reference_audio_inline"].append(time_to_first_audio(client, inline, generation))
        client.delete_voice(registered.voice_id, timeout=60)
    return {"model": model, "reference_seconds": reference_seconds, "create_voice_ms": create_s * 1e3,
            "ttfa": {mode: summary(values) for mode, values in times.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True, help="host:port of a server that loads a Base model")
    parser.add_argument("--iterations", type=int, default=30, help="timed requests of each kind")
    parser.add_argument("--reference-seconds", type=float, default=10.0)
    parser.add_argument("--max-audio-seconds", type=float, default=1.0, help="audio each request asks for")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = run(args.server, args.iterations, args.reference_seconds, args.max_audio_seconds)
    report = {"benchmark": "voice_ttfa", "date": time.strftime("%Y-%m-%d"),
              "command": " ".join(["python -m benchmarks.voice_ttfa", *(argv if argv is not None else sys.argv[1:])]),
              **result}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    lines = [f"{'voice':>24} {'ttfa p50 ms':>12} {'ttfa p95 ms':>12} {'requests':>9}"]
    lines += [f"{mode:>24} {s['p50_ms']:>12.1f} {s['p95_ms']:>12.1f} {s['num_requests']:>9}"
              for mode, s in report["ttfa"].items()]
    lines.append(f"CreateVoice of {args.reference_seconds:g} s of reference: {report['create_voice_ms']:.0f} ms")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
