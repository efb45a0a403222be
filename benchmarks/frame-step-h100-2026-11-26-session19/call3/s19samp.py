"""Session 19: where the sampling kernel's ~11 us a launch go. Variants are patched copies of the module, timed in
CUDA graphs of 16 launches (timing only: the stripped ones draw wrongly)."""
import importlib.util, json, statistics, sys
import torch
from tts_service.runner import sampling_kernel

source = open(sampling_kernel.__file__).read()
dev = torch.device("cuda")


def variant(name, pairs):
    text = source
    for old, new in pairs:
        assert old in text, old
        text = text.replace(old, new)
    path = f"/tmp/{name}.py"
    open(path, "w").write(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RADIX = ("        for bit in tl.static_range(31, -1, -1):", "        for bit in tl.static_range(31, 31, -1):")
NOISE = ("        noise = _gumbel_noise(seed, tl.load(draws_ptr + row * draws_stride).to(tl.int64), cols)",
         "        noise = cols.to(tl.float32) * 0.0")
GREEDY = ("        greedy = tl.argmax(scores, axis=0, tie_break_left=True)", "        greedy = 0")
TOPP = ("        if top_p < 1.0:", "        if top_p < -1.0:")
WARPS4 = ("num_warps=8 if block >= 2048 else 4", "num_warps=4")
WARPS16 = ("num_warps=8 if block >= 2048 else 4", "num_warps=16")
variants = {"as_is": sampling_kernel, "no_radix": variant("no_radix", [RADIX]), "no_noise": variant("no_noise", [NOISE]),
            "no_radix_no_noise": variant("nrnn", [RADIX, NOISE]), "no_greedy": variant("no_greedy", [GREEDY]),
            "bare": variant("bare", [RADIX, NOISE, GREEDY]), "warps4": variant("warps4", [WARPS4]),
            "warps16": variant("warps16", [WARPS16])}


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
    times = []
    for _ in range(30):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); graph.replay(); b.record(); b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return statistics.median(times)


rows = []
for vocab in (2048, 3072):
    batch = 1
    gen = torch.Generator(device=dev).manual_seed(vocab)
    scores = torch.randn(batch, vocab, generator=gen, device=dev) * 3
    args = (scores, torch.full((batch,), 0.9, device=dev), torch.full((batch,), 50, dtype=torch.int64, device=dev),
            torch.ones(batch, device=dev), torch.randint(0, 2**62, (batch,), generator=gen, device=dev),
            torch.randint(0, 2**31, (batch,), generator=gen, device=dev))
    row = {"vocab": vocab, "batch": batch}
    for name, module in variants.items():
        row[name] = timed(lambda: [module.sample_rows(*args) for _ in range(16)]) / 16
    row["empty_graph_of_16_copies"] = timed(lambda: [scores.add_(0) for _ in range(16)]) / 16
    rows.append(row)
    print(json.dumps(row), flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
