"""Session 15 probe: the codec call at 128 rows as the runner runs it, op by op with shapes; and a sweep of the
window attention kernel's tile and warps at 128 rows of one frame."""
import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from tts_service.engine.config import EngineConfig
from tts_service.model import fused_ops
from tts_service.model.checkpoint import LoadOptions, load_model
from tts_service.runner.runner import ModelRunner

out = sys.argv[1]
model = load_model("random:1.7b-custom_voice", LoadOptions.default_for("cuda"))
config = EngineConfig(max_running=128, block_size=32, num_kv_blocks=128 * 4, max_positions_per_request=128,
                      graph_batch_sizes=(128,))
runner = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
decoder = model.codec_decoder
B = 128
slots = torch.randperm(128, device="cuda")
codes = torch.randint(0, 2048, (B, 16, 1), device="cuda")
report = {}
with torch.inference_mode():
    for _ in range(3):
        rows = runner._codec_rows(slots)
        decoder.decode_chunk(codes, rows)
        runner._store_codec_rows(slots, rows)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU], record_shapes=True) as prof:
        rows = runner._codec_rows(slots)
        decoder.decode_chunk(codes, rows)
        runner._store_codec_rows(slots, rows)
        torch.cuda.synchronize()
    table = prof.key_averages(group_by_input_shape=True).table(sort_by="self_cuda_time_total", row_limit=60,
                                                                max_name_column_width=40, max_shapes_column_width=90)
    open(f"{out}/codec_ops.txt", "w").write(table)
    kernels = [(e.name, e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total)
               for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    report["num_device_events"] = len(kernels)
    report["device_us"] = sum(t for _, t in kernels)

    # The window attention kernel at 128 rows of one frame, rings in place.
    layer = decoder.pre_transformer.layers[0].self_attn
    qkv = torch.randn(B, 1, 3 * 1024, device="cuda")
    cos, sin = torch.randn(B, 1, 64, device="cuda"), torch.randn(B, 1, 64, device="cuda")
    position = torch.full((B,), 200, device="cuda", dtype=torch.int64)
    keys = torch.randn(129, 16, 72, 64, device="cuda")
    values = torch.randn(129, 16, 72, 64, device="cuda")
    reference = fused_ops.window_attention(qkv, 16, cos, sin, position, keys.clone(), values.clone(), 0.125, slots)
    sweep = []
    for block in (16, 32, 64, 128):
        for warps in (1, 2, 4, 8):
            def run():
                o = torch.empty(B, 1, 1024, device="cuda")
                fused_ops._window_attention_kernel[(B, 16)](
                    qkv, cos, sin, position, slots, keys, values, o, 1, 72, 3072, 1, 1024, 0.125, HEAD_DIM=64,
                    BLOCK_SLOTS=block, BLOCK_OWN=16, HAS_ROWS=True, num_warps=warps, enable_fp_fusion=False)
                return o
            k0, v0 = keys.clone(), values.clone()
            got = run()
            keys.copy_(k0); values.copy_(v0)
            for _ in range(5):
                run()
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(200):
                run()
            e.record(); e.synchronize()
            keys.copy_(k0); values.copy_(v0)
            sweep.append({"block_slots": block, "num_warps": warps, "us": s.elapsed_time(e) / 200 * 1e3,
                          "max_diff": float((got - reference).abs().max())})
            print(sweep[-1], flush=True)
    report["window_sweep"] = sweep
json.dump(report, open(f"{out}/probe.json", "w"), indent=1)
print(table[:6000])
