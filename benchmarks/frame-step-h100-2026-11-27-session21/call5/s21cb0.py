"""Session 21, call 5: the codebook-0 kernel alone (vocab 3072, one and 64 rows, temperature 0.9 / top-k 50 and
greedy) at 4, 8 and 16 warps, against the sampling kernel on the same scores; 16 launches in a CUDA graph, us a
launch, median of five rounds; each variant's draws checked equal to 8 warps'."""
import json, statistics, sys, time
import torch
import triton
from tts_service.runner import sampling_kernel
from tts_service.runner.sampling_kernel import SlotTensors, _codebook0_kernel

device = torch.device("cuda")
out_path = sys.argv[1]
report = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "results": []}


def timed_us(fn):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(16):
            fn()
    rounds = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            graph.replay()
        end.record(); end.synchronize()
        rounds.append(start.elapsed_time(end) * 1e3 / 320)
    return statistics.median(rounds)


vocab, groups, width = 3072, 16, 1024
for batch in (1, 64):
    for temperature in (0.9, 0.0):
        slots_n = batch + 1
        g = torch.Generator(device=device).manual_seed(0)
        state = SlotTensors(torch.full((slots_n,), temperature, device=device),
                            torch.full((slots_n,), 50, dtype=torch.int64, device=device),
                            torch.ones(slots_n, device=device), torch.full((slots_n,), 0.9, device=device),
                            torch.full((slots_n,), 50, dtype=torch.int64, device=device), torch.ones(slots_n, device=device),
                            torch.arange(slots_n, device=device), torch.full((slots_n,), 1.05, device=device),
                            torch.zeros(slots_n, dtype=torch.int64, device=device),
                            torch.rand(slots_n, vocab, generator=g, device=device) < 0.05)
        logits = torch.randn(batch, vocab, generator=g, device=device).bfloat16()
        slots = torch.arange(batch, device=device)
        frame_index = torch.full((batch,), 7, dtype=torch.int64, device=device)
        suppressed = torch.zeros(vocab, dtype=torch.bool, device=device); suppressed[-1024:] = True
        table = torch.randn(vocab, width, device=device).bfloat16()
        outs = {}

        def launch(warps, keep=None):
            draw = sampling_kernel.Codebook0Draw(*(torch.empty(batch, dtype=torch.int64, device=device) for _ in range(1)),
                                                 torch.empty(batch, width, dtype=table.dtype, device=device),
                                                 torch.empty(batch, device=device),
                                                 torch.empty(batch, dtype=torch.int64, device=device),
                                                 torch.empty(batch, device=device),
                                                 torch.empty(batch, dtype=torch.int64, device=device),
                                                 torch.empty(batch, groups - 1, dtype=torch.int64, device=device))
            def run():
                _codebook0_kernel[(batch,)](
                    logits, slots, frame_index, state.temperature, state.top_k, state.top_p, state.predictor_temperature,
                    state.predictor_top_k, state.predictor_top_p, state.seeds, state.repetition_penalty,
                    state.min_frames, state.seen, suppressed, table, draw.codes, draw.embedding,
                    draw.predictor_temperature, draw.predictor_top_k, draw.predictor_top_p, draw.seeds, draw.draws,
                    logits.stride(0), state.seen.stride(0), vocab, 1, groups, width, BLOCK=4096, BLOCK_W=1024,
                    BLOCK_G=16, num_warps=warps)
            return draw, run

        row = {"batch": batch, "temperature": temperature}
        seen_before = state.seen.clone()
        for warps in (4, 8, 16):
            draw, run = launch(warps)
            state.seen.copy_(seen_before); run(); torch.cuda.synchronize()
            outs[warps] = draw.codes.clone()
            row[f"codebook0_w{warps}_us"] = timed_us(run)
        row["draws_equal"] = all(torch.equal(outs[w], outs[8]) for w in outs)
        scores = logits.float()
        rows_t = torch.full((batch,), temperature, device=device)
        topk = torch.full((batch,), 50, dtype=torch.int64, device=device)
        topp = torch.ones(batch, device=device)
        seeds = torch.arange(batch, device=device)
        draws = torch.full((batch,), 112, dtype=torch.int64, device=device)
        row["sample_rows_us"] = timed_us(lambda: sampling_kernel.sample_rows(scores, rows_t, topk, topp, seeds, draws))
        report["results"].append(row)
        print(json.dumps(row), flush=True)
        json.dump(report, open(out_path, "w"), indent=1)
