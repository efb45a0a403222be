"""Benchmark: a book chapter in one request, through a running server. It sends a text that takes about
`--minutes` to read (the load generator's English sentences, shuffled into paragraphs) as one SynthesizeOnline call,
plays it back as a listener would from its first chunk (observability.playback), and reports first audio, the
real-time factor (wall time over audio time), the segments' pace and every stall. Run it alone for the chapter's own
figures, and beside the load generator to see that neither starves the other; `--max-wall-seconds` ends the call
early (cancelled; the figures cover what arrived).

    python -m benchmarks.chapter --server 127.0.0.1:50051 --minutes 60 --out bench-results/chapter.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from clients.loadgen.schedule import texts
from clients.qwen3_tts_client import AudioFormat, Connection, TtsClient, Voice
from observability.playback import ChunkArrival, stalls
from tts_service.model.speech_length import estimated_speech_seconds

SENTENCES_PER_PARAGRAPH = 8


def chapter_text(minutes: float, seed: int) -> str:
    """Paragraphs of the load generator's English sentences, reshuffled each pass, until reading them takes
    `minutes`."""
    sentences = [text.text for text in texts() if text.language == "english"]
    rng = random.Random(seed)
    paragraphs: list[str] = []
    seconds = 0.0
    while seconds < minutes * 60:
        rng.shuffle(sentences)
        for start in range(0, len(sentences), SENTENCES_PER_PARAGRAPH):
            paragraph = " ".join(sentences[start:start + SENTENCES_PER_PARAGRAPH])
            paragraphs.append(paragraph)
            seconds += estimated_speech_seconds(paragraph)
            if seconds >= minutes * 60:
                break
    return "\n\n".join(paragraphs)


def run_chapter(client: TtsClient, text: str, voice: Voice, max_wall_s: float | None) -> dict[str, Any]:
    started = time.perf_counter()
    call = client.synthesize_online(text, voice, AudioFormat("pcm16"))
    arrivals: list[ChunkArrival] = []
    audio_s = 0.0
    completion = None
    for response in call:
        now = time.perf_counter()
        if response.chunk.num_samples:
            arrivals.append(ChunkArrival(now - started, response.chunk.offset_seconds))
            audio_s = response.chunk.offset_seconds + response.chunk.duration_seconds
        if response.HasField("completion"):
            completion = response.completion
        if max_wall_s is not None and now - started > max_wall_s:
            call.cancel()
            break
    wall_s = time.perf_counter() - started
    found = stalls(arrivals)
    return {
        "text_chars": len(text), "text_reading_s": estimated_speech_seconds(text), "audio_s": audio_s,
        "wall_s": wall_s, "rtf": wall_s / audio_s if audio_s else None,
        "first_audio_ms": arrivals[0].arrival_s * 1e3 if arrivals else None,
        "num_chunks": len(arrivals), "is_complete": completion is not None,
        "finish_reason": None if completion is None else completion.finish_reason,
        "stalls": {"count": found.count, "total_s": found.total_s, "max_s": found.max_s},
        # How far generation ran ahead of playback at its closest, after the first chunk (which starts playback):
        # the margin the segments' boundaries left.
        "min_lead_s": min((arrival.offset_s - arrival.arrival_s + arrivals[0].arrival_s for arrival in arrivals[1:]),
                          default=None),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chapter", description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="127.0.0.1:50051")
    parser.add_argument("--minutes", type=float, default=60.0, help="reading time of the text")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--speaker", default="ryan")
    parser.add_argument("--max-wall-seconds", type=float, default=None)
    parser.add_argument("--label", default="alone")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    text = chapter_text(args.minutes, args.seed)
    with TtsClient(Connection(target=args.server)) as client:
        figures = run_chapter(client, text, Voice(speaker=args.speaker, language="english"), args.max_wall_seconds)
    result = {"benchmark": "chapter", "label": args.label, "date": time.strftime("%Y-%m-%d"),
              "command": " ".join(["python -m benchmarks.chapter", *(argv or sys.argv[1:])]), **figures}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
