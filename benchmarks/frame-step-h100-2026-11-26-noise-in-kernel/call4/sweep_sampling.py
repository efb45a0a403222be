"""Times the sampling kernel (noise made in the kernel) by num_warps at batch 1 and 128, vocab 2048 and 3072, each in
a CUDA graph of 16 launches. Writes JSON to argv[1]."""
import json, sys, torch, triton
from tts_service.runner import sampling_kernel

results = []
for vocab in (2048, 3072):
    for batch in (1, 128):
        g = torch.Generator(device="cuda").manual_seed(0)
        scores = torch.randn(batch, vocab, generator=g, device="cuda")
        temperature = torch.full((batch,), 0.9, device="cuda")
        top_k = torch.full((batch,), 50, dtype=torch.int64, device="cuda")
        top_p = torch.ones(batch, device="cuda")
        seeds = torch.arange(batch, device="cuda")
        draws = torch.arange(batch, device="cuda") * 16
        out = torch.empty(batch, dtype=torch.int64, device="cuda")
        block = triton.next_power_of_2(vocab)
        for warps in (2, 4, 8, 16):
            def launch():
                for _ in range(16):
                    sampling_kernel._sample_rows_kernel[(batch,)](scores, temperature, top_k, top_p, seeds, draws, out,
                        scores.stride(0), vocab, seeds.stride(0), draws.stride(0), BLOCK=block, num_warps=warps)
            launch(); torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph): launch()
            graph.replay(); torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20): graph.replay()
            end.record(); torch.cuda.synchronize()
            row = {"vocab": vocab, "batch": batch, "num_warps": warps, "us_per_launch": start.elapsed_time(end) / 320 * 1000}
            results.append(row); print(json.dumps(row))
json.dump({"device": torch.cuda.get_device_name(), "results": results}, open(sys.argv[1], "w"), indent=1)
