"""The engine benchmarks in one run, on one GPU, against one random 1.7B checkpoint.

    python -m benchmarks.suite --out bench-results [--reference-site DIR]

1. frame-step time at several batch sizes (bench_frame_step),
2. time to first audio and real-time factor per request at several concurrencies (bench_engine),
3. the same texts through the reference `qwen-tts` (bench_reference), giving the speed-up,
4. teacher-forced logits in bf16 against the reference in fp32 (bench_fidelity).

Each runs in its own process, so GPU memory starts clean and the reference can use its own
pinned libraries: `--reference-site` is put first on its PYTHONPATH (qwen-tts pins
transformers 4.57, which may differ from the one the service runs with).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tts_service.model.random_checkpoint import write_random_checkpoint


def run_step(name: str, module: str, args: list[str], timeout_s: float, env: dict[str, str] | None = None) -> dict:
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, "-m", module, *args], env=env, timeout=timeout_s, check=False)
    elapsed = time.perf_counter() - started
    sys.stdout.write(f"{name}: exit {completed.returncode} after {elapsed:.0f} s\n")
    return {"name": name, "returncode": completed.returncode, "elapsed_s": elapsed}


def compare(engine: dict, reference: dict) -> dict:
    """Per text at concurrency 1: the reference's time over the engine's, for the same frames."""
    single = [r for r in engine["requests"] if r["concurrency"] == 1]
    ratios, ttfa_ratios = [], []
    for ref in reference["requests"]:
        ours = [r for r in single if r["text_index"] == ref["text_index"]]
        if not ours:
            continue
        ratios.append(ref["realtime_factor"] / statistics.mean(r["realtime_factor"] for r in ours))
        ttfa_ratios.append(ref["time_to_first_audio_s"] / statistics.mean(r["time_to_first_audio_s"] for r in ours))
    return {"speedup_rtf_mean": statistics.mean(ratios), "speedup_rtf_min": min(ratios),
            "speedup_ttfa_mean": statistics.mean(ttfa_ratios), "num_texts": len(ratios)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/qwen3-tts-bench"),
                        help="where the random checkpoint is written (not under --out: it is gigabytes)")
    parser.add_argument("--preset", default="1.7b-custom_voice")
    parser.add_argument("--reference-site", type=Path, help="a site directory holding qwen-tts and its pins")
    parser.add_argument("--skip", default="",
                        help="comma-separated steps to skip: frame_step,engine,reference,fidelity")
    args = parser.parse_args(argv)
    skipped = set(filter(None, args.skip.split(",")))
    args.out.mkdir(parents=True, exist_ok=True)
    checkpoint = args.work_dir / args.preset
    if not (checkpoint / "config.json").is_file():
        write_random_checkpoint(checkpoint, args.preset, seed=0)

    steps = []
    if "frame_step" not in skipped:
        steps.append(run_step("frame_step", "benchmarks.frame_step",
                              ["--out", str(args.out / "frame_step.json")], timeout_s=240))
    if "engine" not in skipped:
        steps.append(run_step("engine", "benchmarks.engine",
                              ["--model", str(checkpoint), "--out", str(args.out / "engine.json")], timeout_s=240))
    reference_env = dict(os.environ)
    if args.reference_site is not None:
        reference_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(args.reference_site),
                                                                    reference_env.get("PYTHONPATH")]))
    if "reference" not in skipped:
        steps.append(run_step("reference", "benchmarks.reference",
                              ["--checkpoint", str(checkpoint), "--out", str(args.out / "reference.json")],
                              timeout_s=300, env=reference_env))
    if "fidelity" not in skipped:
        steps.append(run_step("fidelity", "benchmarks.fidelity",
                              ["--checkpoint", str(checkpoint), "--out", str(args.out / "fidelity.json")],
                              timeout_s=240, env=reference_env))

    summary: dict = {"benchmark": "suite", "date": time.strftime("%Y-%m-%d"), "preset": args.preset,
                     "command": " ".join(["python -m benchmarks.suite", *(argv or sys.argv[1:])]),
                     "steps": steps}
    engine_path, reference_path = args.out / "engine.json", args.out / "reference.json"
    if engine_path.is_file() and reference_path.is_file():
        summary["comparison"] = compare(json.loads(engine_path.read_text()), json.loads(reference_path.read_text()))
        sys.stdout.write(f"speed-up over qwen-tts at concurrency 1: {json.dumps(summary['comparison'])}\n")
    (args.out / "suite.json").write_text(json.dumps(summary, indent=2))
    return 0 if all(step["returncode"] == 0 for step in steps) else 1


if __name__ == "__main__":
    raise SystemExit(main())
