"""Session 19, in-process A/B of the frame step: one model, four runners captured with the row projections and
the q/k norm inside the attention kernel each on or off, their steps timed interleaved (three rounds). Then the
decode attention alone at the talker's shapes: the separate q/k kernel + attention, the norm inside without FMAs
(as committed), the norm inside with FMAs (timing only)."""
import importlib.util, json, statistics, sys, time
import torch
from benchmarks.frame_step import time_steps
from tts_service.engine.config import EngineConfig
from tts_service.model import fused_ops, row_projections
from tts_service.model.checkpoint import LoadOptions, load_model
from tts_service.model.layers import QKNormRope
from tts_service.runner import kv_cache
from tts_service.runner.runner import ModelRunner

out_path = sys.argv[1]
sizes = sys.argv[2].split(",")
batches = [int(b) for b in sys.argv[3].split(",")]
report = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "results": []}
original_rotates = kv_cache.PagedDecodeBackend.rotates


def emit(**row):
    report["results"].append(row)
    print(json.dumps(row), flush=True)
    json.dump(report, open(out_path, "w"), indent=1)


def configure(rows: bool, rotate: bool) -> None:
    row_projections.MAX_ROWS = 2 if rows else 0
    kv_cache.PagedDecodeBackend.rotates = original_rotates if rotate else (lambda self, query, qk_norm: False)


variants = {"new": (True, True), "no_rows": (False, True), "no_rotate": (True, False), "neither": (False, False)}
for size in sizes:
    model = load_model(f"random:{size}-custom_voice", LoadOptions.default_for("cuda"))
    context, iterations = 300, 40
    blocks_per_row = -(-(context + 3 * 4 * (iterations + 3) + 16) // 32)
    runners = {}
    for name, (rows, rotate) in variants.items():
        configure(rows, rotate)
        config = EngineConfig(max_running=max(batches), block_size=32, num_kv_blocks=max(batches) * blocks_per_row,
                              max_positions_per_request=blocks_per_row * 32, graph_batch_sizes=tuple(batches))
        runners[name] = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
    configure(True, True)
    for batch in batches:
        times = {name: [] for name in variants}
        for _ in range(3):
            for name, runner in runners.items():
                times[name].append(statistics.median(time_steps(runner, batch, context, iterations)) * 1e3)
        emit(size=size, batch=batch, step_ms=times, median_ms={n: statistics.median(t) for n, t in times.items()})
    del runners, model
    torch.cuda.empty_cache()

# The decode attention alone, 28 layers' caches at 300 positions, one row and 64.
source = open(kv_cache.__file__).read()
patched = source.replace("num_warps=4, enable_fp_fusion=qk_norm is None)", "num_warps=4, enable_fp_fusion=True)")
assert patched != source
open("/tmp/kv_fma.py", "w").write(patched)
spec = importlib.util.spec_from_file_location("kv_fma", "/tmp/kv_fma.py")
kv_fma = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kv_fma)
dev = torch.device("cuda")


def timed(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(); fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay(); torch.cuda.synchronize()
    out = []
    for _ in range(30):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); graph.replay(); b.record(); b.synchronize()
        out.append(a.elapsed_time(b) * 1000)
    return statistics.median(out)


for batch in (1, 64):
    gen = torch.Generator(device=dev).manual_seed(batch)
    cache = kv_cache.PagedKVCache(28, batch * 12 + 1, 32, 8, 128, torch.bfloat16, dev)
    cache.storage.normal_(generator=gen)
    tables = torch.arange(batch * 12, dtype=torch.int32, device=dev).view(batch, 12)
    positions = torch.full((batch,), 300, device=dev)
    qkv = torch.randn(batch, 1, 4096, generator=gen, device=dev).bfloat16()
    q, k, v = qkv.split((2048, 1024, 1024), -1)
    q, k = q.view(batch, 1, 16, 128), k.view(batch, 1, 8, 128)
    v = v.view(batch, 1, 8, 128).transpose(1, 2)
    angles = torch.rand(batch, 1, 128, generator=gen, device=dev) * 6
    norm = QKNormRope(torch.ones(128, device=dev).bfloat16(), torch.ones(128, device=dev).bfloat16(), 1e-6,
                      angles.cos().bfloat16(), angles.sin().bfloat16())
    splits = kv_cache.choose_num_splits(batch, 8, 12 * 32, 64, torch.cuda.get_device_properties(dev).multi_processor_count)

    def separate(module=kv_cache):
        for layer in range(28):
            rq, rk = fused_ops.qk_norm_rope(q, k, norm.q_weight, norm.k_weight, norm.eps, norm.cos, norm.sin)
            module.decode_attention_triton(cache.layer(layer), rq[:, :, 0], rk[:, :, 0], v[:, :, 0], tables,
                                           positions, cache.scratch_block, splits)

    def inside(module=kv_cache):
        for layer in range(28):
            module.decode_attention_triton(cache.layer(layer), q[:, 0], k[:, 0], v[:, :, 0], tables, positions,
                                           cache.scratch_block, splits, norm)

    emit(part="attention", batch=batch, splits=splits, separate_us=timed(separate) / 28,
         inside_no_fma_us=timed(inside) / 28, inside_fma_us=timed(lambda: inside(kv_fma)) / 28,
         separate_again_us=timed(separate) / 28)
