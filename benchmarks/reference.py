"""Benchmark 3: the same texts through the official `qwen-tts` generate, on the same checkpoint.

    python -m benchmarks.reference --checkpoint DIR --out bench-results/reference.json

The reference runs one request at a time and returns audio only when the whole utterance is
done, so its time to first audio is its total time. Each request generates exactly the engine
benchmark's number of frames: the stop token is set to a suppressed codec id, which the
reference never samples, so random weights cannot end a request early.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.engine import BENCH_TEXTS, frames_for_text
from benchmarks.reference_oracle import import_qwen_tts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="a checkpoint directory (random weights)")
    parser.add_argument("--speaker", default="ryan")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    is_cuda = args.device.startswith("cuda")
    dtype = torch.bfloat16 if is_cuda else torch.float32
    qwen_tts = import_qwen_tts()
    model = qwen_tts.Qwen3TTSModel.from_pretrained(str(args.checkpoint), dtype=dtype, device_map=args.device)
    talker = model.model.config.talker_config
    never_sampled = talker.vocab_size - 1  # among the ids the reference suppresses, and not the stop token
    assert never_sampled != talker.codec_eos_token_id
    frame_s = 1.0 / 12.5

    def synchronize() -> None:
        if is_cuda:
            torch.cuda.synchronize()

    def generate(text: str, num_frames: int) -> float:
        synchronize()
        started = time.perf_counter()
        model.generate_custom_voice(text, speaker=args.speaker, language="english", non_streaming_mode=False,
                                    max_new_tokens=num_frames, eos_token_id=never_sampled)
        synchronize()
        return time.perf_counter() - started

    generate(BENCH_TEXTS[0], 4)  # warm-up
    requests = []
    for index, text in enumerate(BENCH_TEXTS):
        num_frames = frames_for_text(text)
        total_s = generate(text, num_frames)
        requests.append({"text_index": index, "num_frames": num_frames, "audio_s": num_frames * frame_s,
                         "total_s": total_s, "time_to_first_audio_s": total_s,
                         "realtime_factor": total_s / (num_frames * frame_s)})
    report = {
        "benchmark": "reference", "package": f"qwen-tts {getattr(qwen_tts, '__version__', '0.1.1')}",
        "device": torch.cuda.get_device_name() if is_cuda else "cpu", "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "checkpoint": str(args.checkpoint), "dtype": str(dtype),
        "command": " ".join(["python -m benchmarks.reference", *(argv or sys.argv[1:])]),
        "rtf_mean": statistics.mean(r["realtime_factor"] for r in requests),
        "ttfa_p50_ms": statistics.median(r["time_to_first_audio_s"] for r in requests) * 1e3,
        "requests": requests,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    lines = [f"{'text':>4} {'frames':>6} {'total s':>8} {'rtf':>6}"]
    lines += [f"{r['text_index']:>4} {r['num_frames']:>6} {r['total_s']:>8.2f} {r['realtime_factor']:>6.2f}"
              for r in requests]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
