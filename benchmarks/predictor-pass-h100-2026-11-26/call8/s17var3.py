"""Session 17 probe, call 8: variants of the one-kernel predictor call, timed over codebooks 2..15 in CUDA graphs
(batch 1, 2, 4): programs per SM, warps, and (timing only, from patched copies of the module) no grid barriers
and a plain L2 prefetch."""
import importlib.util, json, statistics, sys, time
import torch
from tts_service.model.checkpoint import LoadOptions, load_model
from tts_service.model.layers import use_fused_kernels
from tts_service.runner.frame_codes import predictor_hidden
from tts_service.runner.frame_step import PagedPredictorCache
from tts_service.runner import predictor_pass

out_path = sys.argv[1]
dev = torch.device("cuda")
source = open(predictor_pass.__file__).read()


def patched(name, old, new):
    assert old in source, name
    path = f"/tmp/{name}.py"
    open(path, "w").write(source.replace(old, new))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


spec = importlib.util.spec_from_file_location("pp_246cbf4", ".devwork/pp_246cbf4.py")
committed = importlib.util.module_from_spec(spec)
spec.loader.exec_module(committed)
report = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "results": []}
sms = torch.cuda.get_device_properties(dev).multi_processor_count
for size in ("1.7b", "0.6b"):
    model = load_model(f"random:{size}-custom_voice", LoadOptions.default_for("cuda"))
    talker = model.talker
    use_fused_kernels(talker, True)
    predictor = talker.code_predictor
    G = talker.config.num_code_groups
    memory = PagedPredictorCache(talker, 4, torch.bfloat16, dev)
    rope = predictor.rope_table(G, torch.bfloat16)

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

    with torch.inference_mode():
        for batch in (1, 2, 4):
            inp = predictor.embed(1, torch.zeros(batch, dtype=torch.long, device=dev))[:, None].contiguous()
            row = {"size": size, "batch": batch,
                   "chain": timed(lambda: [predictor.logits(g, predictor_hidden(talker, g, inp, rope, memory)).float()
                                           for g in range(2, G)])}
            variants = {
                "committed_246cbf4": (committed, dict()),
                "pipelined": (predictor_pass, dict()),
                "pipelined_t16": (predictor_pass, dict(tile_rows=16)),
            }
            for name, (module, kwargs) in variants.items():
                variant = module.PredictorPass(talker, memory.cache.storage, **kwargs)
                try:
                    row[name] = timed(lambda: [variant.logits(g, inp[:, 0]) for g in range(2, G)])
                except Exception as error:
                    row[name + "_error"] = repr(error)[:300]
                print(name, row.get(name), flush=True)
            report["results"].append(row)
            print(json.dumps(row), flush=True)
with open(out_path, "w") as f:
    json.dump(report, f, indent=1)
