"""Session 20: the sampling kernel with the two-bit select and the greedy branch (the tree) against HEAD's
(.devwork/sk_head.py), in CUDA graphs of 16 launches; draws compared on many rows (top-k 50 / 1 / off, greedy)."""
import importlib.util, json, statistics, sys, time
import torch
from tts_service.runner import sampling_kernel

dev = torch.device("cuda")
spec = importlib.util.spec_from_file_location("sk_head", ".devwork/sk_head.py")
head = importlib.util.module_from_spec(spec)
spec.loader.exec_module(head)
report = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "results": []}


def timed_us(fn, launches=16):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(); fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(30):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); graph.replay(); b.record(); b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / launches)
    return statistics.median(times)


def arguments(batch, vocab, temperature, top_k, seed):
    gen = torch.Generator(device=dev).manual_seed(seed)
    scores = (torch.randn(batch, vocab, generator=gen, device=dev) * 3 * 4).round() / 4
    return (scores, torch.full((batch,), temperature, device=dev),
            torch.full((batch,), top_k, dtype=torch.int64, device=dev), torch.ones(batch, device=dev),
            torch.randint(0, 2**62, (batch,), generator=gen, device=dev),
            torch.randint(0, 2**31, (batch,), generator=gen, device=dev))


agreement = {}
for vocab in (2048, 3072):
    for temperature, top_k in ((0.9, 50), (0.9, 1), (1.0, 0), (0.0, 50)):
        args = arguments(512, vocab, temperature, top_k, vocab + top_k)
        agreement[f"v{vocab}_t{temperature}_k{top_k}"] = bool(torch.equal(sampling_kernel.sample_rows(*args),
                                                                           head.sample_rows(*args)))
print(json.dumps({"equal_draws": agreement}), flush=True)
report["equal_draws"] = agreement
for vocab in (2048, 3072):
    for batch in (1, 2, 64):
        for temperature in (0.9, 0.0):
            args = arguments(batch, vocab, temperature, 50, batch)
            times = {"head": [], "new": []}
            for _ in range(5):
                times["head"].append(timed_us(lambda: head.sample_rows(*args)))
                times["new"].append(timed_us(lambda: sampling_kernel.sample_rows(*args)))
            row = {"vocab": vocab, "batch": batch, "temperature": temperature, "top_k": 50,
                   "us_per_launch": {n: round(statistics.median(t), 2) for n, t in times.items()},
                   "rounds": {n: [round(x, 2) for x in t] for n, t in times.items()}}
            report["results"].append(row)
            print(json.dumps(row), flush=True)
json.dump(report, open(sys.argv[1], "w"), indent=1)
