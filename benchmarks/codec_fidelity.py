"""How far the codec decoder's waveform moves in bf16: ours against the reference's own, on the same weights.

    PYTHONPATH=REFERENCE_SITE:$PYTHONPATH python -m benchmarks.codec_fidelity --out bench-results/codec_fidelity.json

Random weights at the released decoder's shape go into this project's decoder and into `qwen-tts`'s. Both decode
the same random codes in fp32 and in bf16 (the reference in bf16 is what `qwen-tts` runs when loaded with
`dtype=torch.bfloat16`, as its examples do). The yardstick for every variant is the reference in fp32 with cuDNN's
TF32 off, the exact answer; `reference_float32` is the reference as it runs by default, its convolutions in TF32
(PyTorch's default for cuDNN), which is what this decoder runs too. Ours is decoded twice per dtype: in one shot,
and as the engine streams it, one frame per `decode_chunk` call; in fp32 also with its convolutions in fp16
(`--codec-convolution-dtype float16`).
REFERENCE_SITE holds qwen-tts and its pins (`bash benchmarks/fetch_wheels.sh ref`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from benchmarks.reference_oracle import import_qwen_tts
from tts_service.model.codec_decoder import CodecDecoder
from tts_service.model.configs import SpeechTokenizerConfig
from tts_service.model.random_checkpoint import speech_tokenizer_config_dict


def waveform_error(wave: torch.Tensor, yardstick: torch.Tensor) -> dict[str, float]:
    """Max and RMS difference, and the signal-to-error ratio in dB, of a waveform against the yardstick."""
    difference = (wave.double() - yardstick.double()).flatten()
    signal = yardstick.double().flatten()
    error_power = difference.pow(2).sum().item()
    return {"max_abs": difference.abs().max().item(), "rms": difference.pow(2).mean().sqrt().item(),
            "snr_db": math.inf if error_power == 0 else 10 * math.log10(signal.pow(2).sum().item() / error_power)}


@torch.no_grad()
def streamed(decoder: CodecDecoder, codes: torch.Tensor) -> torch.Tensor:
    """One frame per call, carrying the stream state, as the engine decodes."""
    state = decoder.new_stream_state(codes.shape[0])
    return torch.cat([decoder.decode_chunk(codes[:, :, frame:frame + 1], state)
                      for frame in range(codes.shape[2])], dim=-1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--frames", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    raw_config = speech_tokenizer_config_dict("1.7b")["decoder_config"]
    config = SpeechTokenizerConfig.parse({"decoder_config": raw_config}).decoder
    ours = CodecDecoder(config).eval()
    ours.randomize_(torch.Generator().manual_seed(args.seed))
    qwen_tts = import_qwen_tts()
    reference = qwen_tts.core.Qwen3TTSTokenizerV2Model(
        qwen_tts.core.Qwen3TTSTokenizerV2Config(decoder_config=raw_config)).decoder.eval()
    reference.load_state_dict(ours.state_dict(), strict=True)
    generator = torch.Generator().manual_seed(args.seed + 1)
    codes = torch.randint(0, config.codebook_size, (args.rows, config.num_quantizers, args.frames),
                          generator=generator).to(device)
    ours.to(device).use_fused_kernels(device.type == "cuda")
    reference.to(device)
    waves: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        allows_tf32 = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        yardstick = reference(codes)[:, 0].float()
        torch.backends.cudnn.allow_tf32 = allows_tf32
        for dtype in (torch.float32, torch.bfloat16):
            name = str(dtype).removeprefix("torch.")
            reference.to(dtype)
            ours.to(dtype)
            waves[f"reference_{name}"] = reference(codes)[:, 0].float()
            waves[f"ours_{name}_one_shot"] = ours(codes)[:, 0].float()
            waves[f"ours_{name}_streamed"] = streamed(ours, codes).float()
            if dtype == torch.float32:
                ours.use_half_convolutions(True)
                waves["ours_float32_fp16_convolutions_one_shot"] = ours(codes)[:, 0].float()
                waves["ours_float32_fp16_convolutions_streamed"] = streamed(ours, codes).float()
                ours.use_half_convolutions(False)
    errors = {name: waveform_error(wave, yardstick) for name, wave in waves.items()}
    report = {"benchmark": "codec_fidelity", "device": torch.cuda.get_device_name() if device.type == "cuda"
              else "cpu", "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "rows": args.rows,
              "frames": args.frames, "yardstick": "reference_float32 with cuDNN's TF32 off",
              "yardstick_rms": yardstick.pow(2).mean().sqrt().item(),
              "command": " ".join(["python -m benchmarks.codec_fidelity", *(argv or sys.argv[1:])]),
              "errors": errors}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    sys.stdout.write(f"against the reference in exact fp32 (waveform rms {report['yardstick_rms']:.4f}):\n")
    for name, error in errors.items():
        sys.stdout.write(f"  {name:<40} max {error['max_abs']:.2e}  rms {error['rms']:.2e}  "
                         f"snr {error['snr_db']:6.1f} dB\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
