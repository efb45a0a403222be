"""Session 19 probe: (A) the sampling kernel's radix select, a hex digit a step, against the bit-a-step kernel
(HEAD's, .devwork/sk_prev.py): draws equal, time per launch; (B) the row projections (norm / SiLU inside) against
the norm kernel + cuBLAS (+ SiLU kernel) at the talkers' shapes, over 28 layers' weights in a CUDA graph, for a
sweep of tilings; agreement with the chain."""
import importlib.util, itertools, json, statistics, sys, time
import torch
import torch.nn.functional as F
from tts_service.model import fused_ops, row_projections
from tts_service.runner import sampling_kernel as new_sk

out_path = sys.argv[1]
parts = sys.argv[2].split(",") if len(sys.argv) > 2 else ["sampling", "rows"]
dev = torch.device("cuda")
report = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "results": []}


def emit(**row):
    report["results"].append(row)
    print(json.dumps(row), flush=True)
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(fn, replays=30):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(); fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); graph.replay(); b.record(); b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return statistics.median(times)


if "sampling" in parts:
    prev_sk = load("sk_prev", ".devwork/sk_prev.py")
    for vocab in (2048, 3072):
        for batch in (1, 16, 64):
            gen = torch.Generator(device=dev).manual_seed(vocab + batch)
            scores = torch.randn(batch, vocab, generator=gen, device=dev) * 3
            scores[:, -5:] = float("-inf")
            temperature = torch.full((batch,), 0.9, device=dev)
            top_k = torch.full((batch,), 50, dtype=torch.int64, device=dev)
            top_p = torch.ones(batch, device=dev)
            seeds = torch.randint(0, 2**62, (batch,), generator=gen, device=dev)
            draws = torch.randint(0, 2**31, (batch,), generator=gen, device=dev)
            equal = True
            for k in (50, 0, 1, vocab, 3):
                top_k.fill_(k)
                a = prev_sk.sample_rows(scores, temperature, top_k, top_p, seeds, draws)
                b = new_sk.sample_rows(scores, temperature, top_k, top_p, seeds, draws)
                equal &= bool(torch.equal(a, b))
            top_k.fill_(50)
            row = {"part": "sampling", "vocab": vocab, "batch": batch, "draws_equal": equal}
            for name, mod in (("prev", prev_sk), ("new", new_sk), ("prev_again", prev_sk), ("new_again", new_sk)):
                row[name + "_us_per_launch"] = timed(
                    lambda: [mod.sample_rows(scores, temperature, top_k, top_p, seeds, draws) for _ in range(16)]) / 16
            emit(**row)

if "rows" in parts:
    sizes = {"1.7b": (2048, 6144), "0.6b": (1024, 3072)}
    tilings = [row_projections.Tiling(t, c, w) for t, c, w in itertools.product((4, 8, 16), (512, 1024), (4, 8))]
    gated_tilings = [row_projections.Tiling(t, c, w) for t, c, w in itertools.product((2, 4, 8), (256, 512), (4, 8))]
    for size, (hidden, intermediate) in sizes.items():
        qkv_width, attention_width = 4096, 2048
        shapes = {"normed": (qkv_width, hidden), "gated": (2 * intermediate, hidden), "o": (hidden, attention_width),
                  "down": (hidden, intermediate)}
        for batch in (1, 2):
            gen = torch.Generator(device=dev).manual_seed(batch)
            for kind, (n, k) in shapes.items():
                weights = [(torch.randn(n, k, generator=gen, device=dev) / k ** 0.5).bfloat16() for _ in range(28)]
                norm_weight = (1 + torch.randn(k, generator=gen, device=dev) / 4).bfloat16()
                x = torch.randn(batch, 1, k, generator=gen, device=dev).bfloat16()
                delta = torch.randn(batch, 1, k, generator=gen, device=dev).bfloat16()
                eps = 1e-6

                def chain(w):
                    if kind == "normed":
                        _, normed = fused_ops.add_rms_norm(x, delta, norm_weight, eps)
                        return F.linear(normed, w)
                    if kind == "gated":
                        _, normed = fused_ops.add_rms_norm(x, delta, norm_weight, eps)
                        gate, up = F.linear(normed, w).chunk(2, dim=-1)
                        return fused_ops.silu_mul(gate, up)
                    return F.linear(x, w)

                def rows(w, tiling):
                    if kind == "normed":
                        return row_projections.normed_projection(x, delta, norm_weight, eps, w, tiling)[1]
                    if kind == "gated":
                        return row_projections.gated_projection(x, delta, norm_weight, eps, w, tiling)[1]
                    return row_projections.projection(x, w, tiling)

                # fp32 truth for the first layer's weights, to set the chain's own error beside the kernel's.
                w0 = weights[0]
                if kind in ("normed", "gated"):
                    total = (x.float() + delta.float()).bfloat16().float()
                    h = total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()
                    truth = h @ w0.float().T
                    if kind == "gated":
                        g, u = truth.chunk(2, dim=-1)
                        truth = F.silu(g) * u
                else:
                    truth = x.float() @ w0.float().T
                reference = chain(w0)
                row = {"part": "rows", "size": size, "batch": batch, "kind": kind, "n": n, "k": k,
                       "chain_us": timed(lambda: [chain(w) for w in weights]) / 28,
                       "chain_err": (reference.float() - truth).abs().mean().item(), "tilings": []}
                candidates = gated_tilings if kind == "gated" else tilings
                if batch > 1:
                    candidates = [t for t in candidates if t.chunk == 512 and t.tile_rows in ((2, 4) if kind == "gated" else (4, 8))]
                for tiling in candidates:
                    try:
                        out = rows(w0, tiling)
                        entry = {"tiling": [tiling.tile_rows, tiling.chunk, tiling.num_warps],
                                 "err": (out.float() - truth).abs().mean().item(),
                                 "max_vs_chain": (out.float() - reference.float()).abs().max().item(),
                                 "equal_frac": (out == reference).float().mean().item(),
                                 "us": timed(lambda: [rows(w, tiling) for w in weights]) / 28}
                    except Exception as error:  # noqa: BLE001 - a tiling that fails to compile is a result too
                        entry = {"tiling": [tiling.tile_rows, tiling.chunk, tiling.num_warps], "error": repr(error)[:300]}
                    row["tilings"].append(entry)
                best = min((t for t in row["tilings"] if "us" in t), key=lambda t: t["us"])
                row["best"] = best
                row["chain_again_us"] = timed(lambda: [chain(w) for w in weights]) / 28
                emit(**row)
                del weights
                torch.cuda.empty_cache()
