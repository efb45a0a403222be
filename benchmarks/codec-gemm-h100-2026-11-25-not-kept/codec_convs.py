"""Which codec convolutions launch cuDNN's layout transforms, and what a GEMM form would cost instead.

Run on the GPU machine from the repository root (wheels as benchmarks/device_server.sh installs them):
    PYTHONPATH=$PWD:$PWD/proto python benchmarks/codec-gemm-h100-2026-11-25-not-kept/codec_convs.py OUT_JSON
"""
import json
import sys
import time
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from tts_service.model.checkpoint import LoadOptions, load_model
from tts_service.model.codec_decoder import CausalConv1d, CausalConvTranspose1d

model = load_model("random:1.7b-custom_voice", LoadOptions.default_for("cuda", "float32"))
decoder = model.codec_decoder
names = {}
for name, module in decoder.named_modules():
    if isinstance(module, (CausalConv1d, CausalConvTranspose1d)):
        names[module] = name
        module.register_forward_pre_hook(
            lambda m, a: setattr(m, "_rf", record_function("conv:" + names[m]).__enter__()))
        module.register_forward_hook(lambda m, a, o: m._rf.__exit__(None, None, None))

report = {}
for batch in (1, 128):
    codes = torch.randint(0, decoder.config.codebook_size, (batch, 16, 1), device="cuda")
    state = decoder.new_stream_state(batch)
    with torch.inference_mode():
        for _ in range(3):
            decoder.decode_chunk(codes, state)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            decoder.decode_chunk(codes, state)
            torch.cuda.synchronize()
    rows = []
    for event in prof.events():
        if not event.name.startswith("conv:"):
            continue
        kernels = defaultdict(float)
        stack = [event]
        while stack:
            e = stack.pop()
            for k in e.kernels:
                kernels[k.name[:60]] += k.duration / 1e3 if hasattr(k, "duration") else 0
            stack.extend(e.cpu_children)
        total = sum(kernels.values())
        transforms = sum(v for k, v in kernels.items() if "nchwToNhwc" in k or "nhwcToNchw" in k)
        rows.append({"module": event.name[5:], "kernel_ms": total, "transform_ms": transforms,
                     "kernels": dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:4])})
    report[batch] = rows

# The heaviest decoder-input conv as one GEMM over unfolded inputs, against cuDNN, at 1 and 128 rows.
conv = decoder.decoder[0].conv
weight = conv.weight  # [out, in, k]
flat = weight.reshape(weight.shape[0], -1).contiguous()
timing = {}
for batch in (1, 128):
    x = torch.randn(batch, weight.shape[1], 6 + 4, device="cuda")  # 6 history + 4 new samples
    def cudnn(x: torch.Tensor = x) -> torch.Tensor:
        return F.conv1d(x, weight, conv.bias)

    def gemm(x: torch.Tensor = x, batch: int = batch) -> torch.Tensor:
        cols = x.unfold(2, weight.shape[2], 1)  # [B, in, T, k]
        cols = cols.permute(0, 2, 1, 3).reshape(batch, -1, flat.shape[1])  # [B, T, in*k]
        return (cols @ flat.T + conv.bias).transpose(1, 2)
    out = {}
    for name, fn in (("cudnn", cudnn), ("gemm", gemm)):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        out[name + "_ms"] = (time.perf_counter() - started) / 50 * 1e3
    with torch.inference_mode():
        exact = F.conv1d(x.double(), weight.double(), conv.bias.double())
        out["cudnn_max_err"] = (cudnn().double() - exact).abs().max().item()
        out["gemm_max_err"] = (gemm().double() - exact).abs().max().item()
    timing[batch] = out
report["decoder0_cudnn_vs_gemm"] = timing
with open(sys.argv[1], "w") as out:
    json.dump(report, out, indent=1)
for batch in (1, 128):
    rows = sorted(report[batch], key=lambda r: -r["transform_ms"])
    print("batch", batch, "total conv kernel ms", round(sum(r["kernel_ms"] for r in rows), 3),
          "transforms ms", round(sum(r["transform_ms"] for r in rows), 3))
    for r in rows[:8]:
        print("  ", r["module"], round(r["kernel_ms"], 3), round(r["transform_ms"], 3), list(r["kernels"].items())[:2])
print(json.dumps(timing, indent=1))
