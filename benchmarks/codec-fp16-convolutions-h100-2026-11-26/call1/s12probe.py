"""Session 12 probe: the codec's convolutions with fp16 inputs (fp32 accumulation, as TF32 rounds its inputs to the
same 10-bit mantissa) against TF32, by speed (runner graphs) and waveform error (against exact fp32)."""

import json
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.codec import profile_call, time_calls
from benchmarks.codec_fidelity import streamed, waveform_error
from tts_service.engine.config import EngineConfig
from tts_service.model import codec_decoder as cd
from tts_service.model.checkpoint import LoadOptions, load_model
from tts_service.runner.runner import ModelRunner

out_path = sys.argv[1]
original = cd._convolve_over_time
half_filters: dict[int, torch.Tensor] = {}
peaks: list[float] = []
track = {"on": False}


def convolve_half(x, filters, bias, dilation=1, groups=1):
    if filters.shape[0] == 1:  # the last convolution, to the waveform: kept in fp32
        return original(x, filters, bias, dilation, groups)
    f16 = half_filters.get(filters.data_ptr())
    if f16 is None:
        f16 = half_filters[filters.data_ptr()] = filters.half().contiguous(memory_format=torch.channels_last)
    y = F.conv2d(x.half().transpose(1, 2).unsqueeze(2), f16, None, dilation=(1, dilation), groups=groups)
    if track["on"]:
        peaks.append(max(float(y.float().abs().max()), float(x.abs().max())))
    y = y.squeeze(2).transpose(1, 2).float()
    return y if bias is None else y + bias


def variant(name):
    cd._convolve_over_time = convolve_half if "fp16" in name else original
    torch.backends.cuda.matmul.allow_tf32 = "tf32mm" in name


report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
          "speed": {}, "profiles": {}, "fidelity": {}}
model = load_model("random:1.7b-custom_voice", LoadOptions.default_for("cuda"))
decoder = model.codec_decoder
batch_sizes = (1, 32, 64, 128)
for name in ("tf32", "fp16", "fp16+tf32mm", "tf32"):
    variant(name)
    with torch.inference_mode():
        codes = torch.randint(0, 2048, (2, 16, 1), device="cuda")
        decoder.decode_chunk(codes, decoder.new_stream_state(2))
    config = EngineConfig(max_running=128, num_kv_blocks=64, max_positions_per_request=256,
                          graph_batch_sizes=batch_sizes, codec_chunk_schedule=(1,),
                          prefill_graph_batch_sizes=(), prefill_graph_lengths=())
    runner = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
    rows = {}
    for batch in batch_sizes:
        rows[batch] = statistics.median(time_calls(runner, batch, 1, 30)) * 1e3
    key = name if name not in report["speed"] else name + "-again"
    report["speed"][key] = rows
    report["profiles"][key] = profile_call(runner, 128, 1)
    print(key, {b: round(v, 3) for b, v in rows.items()}, report["profiles"][key]["num_kernels"],
          round(report["profiles"][key]["kernel_time_us"] / 1e3, 3), flush=True)
    del runner
    torch.cuda.empty_cache()

# Fidelity: the decoder's own exact fp32 (TF32 off) one-shot decode is the yardstick.
generator = torch.Generator().manual_seed(1)
codes = torch.randint(0, 2048, (4, 16, 150), generator=generator).cuda()
with torch.no_grad():
    variant("tf32")
    torch.backends.cudnn.allow_tf32 = False
    yardstick = decoder(codes)[:, 0].float()
    torch.backends.cudnn.allow_tf32 = True
    waves = {}
    for name in ("tf32", "fp16", "fp16+tf32mm"):
        variant(name)
        track["on"] = name == "fp16"
        waves[f"{name}_one_shot"] = decoder(codes)[:, 0].float()
        track["on"] = False
        waves[f"{name}_streamed"] = streamed(decoder, codes).float()
report["fidelity"] = {name: waveform_error(w, yardstick) for name, w in waves.items()}
report["fidelity_yardstick_rms"] = float(yardstick.pow(2).mean().sqrt())
report["fp16_peak_abs_per_conv"] = peaks
for name, e in report["fidelity"].items():
    print(f"{name:<22} max {e['max_abs']:.2e} rms {e['rms']:.2e} snr {e['snr_db']:.1f} dB")
print("peak |conv in/out| in fp16 one-shot:", max(peaks), "of", len(peaks), "convs")
for key, prof in report["profiles"].items():
    print(key, [(k["count"], round(k["total_us"]), k["name"][:60]) for k in prof["top_kernels"][:10]])
with open(out_path, "w") as f:
    json.dump(report, f, indent=1)
