"""Where a lone request's time to first audio goes: the runner's phases timed one by one.

    python -m benchmarks.profile_first_audio --out bench-results/first_audio.json

For each benchmark text: building the prompt (tokenizer and layout, on the host), the prefill
step (prompt embedding, talker prefill, the first frame's graph, one device-to-host copy), the
next decode step, and the first codec chunk (one frame). The engine's time to first audio at
concurrency 1 is these plus its own loop; comparing the two shows what the loop costs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from benchmarks.engine import BENCH_TEXTS
from tts_service.engine.config import EngineConfig
from tts_service.model.checkpoint import LoadOptions
from tts_service.model.loading import load_model
from tts_service.model.prompts import PromptBuilder, SynthesisInput
from tts_service.runner.params import GenerationParams
from tts_service.runner.runner import DecodeInput, ModelRunner, PrefillInput, StepInput


def median_ms(action: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        _synchronize()
        started = time.perf_counter()
        action()
        _synchronize()
        times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times)


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def profile_text(runner: ModelRunner, prompts: PromptBuilder, text: str, repeats: int) -> dict:
    request = SynthesisInput(text, "english", "ryan")
    prompt = prompts.build(request)
    blocks = tuple(range(-(-(prompt.num_positions + 16) // runner.config.block_size)))
    prefill = PrefillInput(slot=0, block_ids=blocks, prompt=prompt, params=GenerationParams(seed=1))
    frame0 = runner.execute(StepInput(prefills=(prefill,))).prefill_frames
    decode = DecodeInput(slot=0, block_ids=blocks, position=prompt.num_positions, frame_index=1,
                         text_id=prompt.trailing_text_ids[0] if prompt.trailing_text_ids else 0)

    def first_chunk() -> np.ndarray:
        runner.reset_audio([0])
        return runner.decode_audio([0], frame0[None])

    phases = {
        "build_prompt_ms": median_ms(lambda: prompts.build(request), repeats),
        "prefill_and_first_frame_ms": median_ms(lambda: runner.execute(StepInput(prefills=(prefill,))), repeats),
        "decode_step_ms": median_ms(lambda: runner.execute(StepInput(decodes=(decode,))), repeats),
        "first_codec_chunk_ms": median_ms(first_chunk, repeats),
    }
    return {"prompt_positions": prompt.num_positions, **phases, "sum_ms": sum(phases.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="random:1.7b-custom_voice")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    model = load_model(args.model, LoadOptions.default_for(args.device))
    config = EngineConfig(max_running=4, num_kv_blocks=64, max_positions_per_request=1024, graph_batch_sizes=(1, 2, 4),
                          codec_chunk_schedule=(1, 2, 4))
    runner = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
    prompts = PromptBuilder.for_tokenizer(model.config, model.tokenizer)
    results = [{"text_index": index, **profile_text(runner, prompts, text, args.repeats)}
               for index, text in enumerate(BENCH_TEXTS)]
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    report = {"benchmark": "profile_first_audio", "device": device_name, "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "model": args.model,
              "command": " ".join(["python -m benchmarks.profile_first_audio", *(argv or sys.argv[1:])]),
              "texts": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    keys = [key for key in results[0] if key.endswith("_ms")]
    sys.stdout.write(" ".join(f"{key.removesuffix('_ms'):>26}" for key in ["prompt_positions", *keys]) + "\n")
    for result in results:
        sys.stdout.write(" ".join(f"{result[key]:>26.1f}" for key in ["prompt_positions", *keys]) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
