"""Session 17 probe: the one-kernel predictor call against the layer-by-layer chain (bf16), both against an fp32
chain on the same weights; and their times in CUDA graphs over codebooks 2..15."""
import copy, json, statistics, sys, time, types
import torch
from tts_service.model.checkpoint import LoadOptions, load_model
from tts_service.model.layers import use_fused_kernels
from tts_service.runner.frame_codes import predictor_hidden
from tts_service.runner.frame_step import PagedPredictorCache, PredictorCache
from tts_service.runner.predictor_pass import PredictorPass

out_path = sys.argv[1]
sizes = sys.argv[2].split(",")
dev = torch.device("cuda")
report = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "results": []}


def emit(**row):
    report["results"].append(row)
    print(json.dumps(row), flush=True)


for size in sizes:
    model = load_model(f"random:{size}-custom_voice", LoadOptions.default_for("cuda"))
    talker = model.talker
    use_fused_kernels(talker, True)
    predictor = talker.code_predictor
    G = talker.config.num_code_groups
    ref_predictor = copy.deepcopy(predictor).float()
    use_fused_kernels(ref_predictor, False)
    ref_talker = types.SimpleNamespace(code_predictor=ref_predictor, config=talker.config)
    memory = PagedPredictorCache(talker, 4, torch.bfloat16, dev)
    one = PredictorPass(talker, memory.cache.storage)
    rope = predictor.rope_table(G, torch.bfloat16)
    ref_rope = ref_predictor.rope_table(G, torch.float32)
    storage = memory.cache.storage
    with torch.inference_mode():
        for batch in (1, 4):
            gen = torch.Generator(device=dev).manual_seed(batch)
            hidden0 = torch.randn(batch, talker.config.layers.hidden_size, generator=gen, device=dev).bfloat16()
            code = torch.randint(0, 2048, (batch,), generator=gen, device=dev)
            inputs = torch.stack([hidden0, talker.embed_codec(code)], dim=1)
            ref_memory = PredictorCache(ref_talker, batch, torch.float32, dev)
            predictor_hidden(talker, 1, inputs, rope, memory)
            ref_h = predictor_hidden(ref_talker, 1, inputs.float(), ref_rope, ref_memory)
            code = ref_predictor.logits(1, ref_h).argmax(-1)
            for g in range(2, G):
                inp = predictor.embed(g - 1, code)[:, None]
                snap = storage.clone()
                chain = predictor.logits(g, predictor_hidden(talker, g, inp, rope, memory)).float()
                cache_chain = storage.clone()
                storage.copy_(snap)
                fused = one.logits(g, inp[:, 0]).clone()
                cache_one = storage.clone()
                ref = ref_predictor.logits(g, predictor_hidden(ref_talker, g, inp.float(), ref_rope, ref_memory)).float()
                written = (cache_chain != snap) | (cache_one != snap)
                emit(size=size, batch=batch, codebook=g,
                     max_abs_one_vs_chain=(fused - chain).abs().max().item(),
                     argmax_equal=(fused.argmax(-1) == chain.argmax(-1)).float().mean().item(),
                     mean_abs_chain_vs_fp32=(chain - ref).abs().mean().item(),
                     mean_abs_one_vs_fp32=(fused - ref).abs().mean().item(),
                     cache_max_abs=(cache_one.float() - cache_chain.float()).abs().max().item(),
                     cache_bit_equal=(cache_one == cache_chain).float()[written].mean().item() if written.any() else 1.0,
                     logits_bit_equal=(fused == chain).float().mean().item())
                storage.copy_(cache_chain)
                code = ref.argmax(-1)

        # Timing: 14 calls (codebooks 2..15), chain against one call, in CUDA graphs.
        def chain_calls(batch, inp):
            for g in range(2, G):
                predictor.logits(g, predictor_hidden(talker, g, inp, rope, memory)).float()

        def timed(fn):
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                fn(); fn()
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            for _ in range(5):
                graph.replay()
            torch.cuda.synchronize()
            times = []
            for _ in range(50):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(); graph.replay(); b.record(); b.synchronize()
                times.append(a.elapsed_time(b) * 1000)
            return statistics.median(times)

        for batch in (1, 2, 4):
            inp = predictor.embed(1, torch.zeros(batch, dtype=torch.long, device=dev))[:, None].contiguous()
            row = {"size": size, "batch": batch, "timing": True, "chain_us_14_calls": timed(lambda: chain_calls(batch, inp))}
            for tile_rows, warps, prefetch in ((8, 8, True), (8, 8, False), (16, 8, True), (8, 4, True), (4, 8, True)):
                variant = PredictorPass(talker, memory.cache.storage, tile_rows=tile_rows, num_warps=warps,
                                        prefetch=prefetch)
                try:
                    row[f"one_us_14_calls_t{tile_rows}_w{warps}_p{int(prefetch)}"] = timed(
                        lambda: [variant.logits(g, inp[:, 0]) for g in range(2, G)])
                except Exception as error:  # a variant that does not compile is reported, not fatal
                    row[f"one_t{tile_rows}_w{warps}_error"] = repr(error)[:300]
            emit(**row)
    del model, talker, predictor, ref_predictor, memory, one
    torch.cuda.empty_cache()

with open(out_path, "w") as f:
    json.dump(report, f, indent=1)
