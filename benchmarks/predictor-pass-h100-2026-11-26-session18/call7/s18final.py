"""Session 18 probe (final tree): the predictor kernel (two chunks in flight at one row) against e68a2c2's and
dc4eea4's kernels and the layer chain, in CUDA graphs over codebooks 2..15 at 1 and 2 rows, and its agreement
with the chain."""
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


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def patched(name, pairs):
    text = source
    for old, new in pairs:
        assert old in text, old
        text = text.replace(old, new)
    open(f"/tmp/{name}.py", "w").write(text)
    return load(name, f"/tmp/{name}.py")


e68 = load("pp_e68", ".devwork/pp_e68.py")
head = load("pp_head", ".devwork/pp_head.py")
report = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "results": []}


def emit(**row):
    report["results"].append(row)
    print(json.dumps(row), flush=True)


for size in ("1.7b",):
    model = load_model(f"random:{size}-custom_voice", LoadOptions.default_for("cuda"))
    talker = model.talker
    use_fused_kernels(talker, True)
    predictor = talker.code_predictor
    G = talker.config.num_code_groups
    memory = PagedPredictorCache(talker, 4, torch.bfloat16, dev)
    rope = predictor.rope_table(G, torch.bfloat16)
    storage = memory.cache.storage

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
        committed = head.PredictorPass(talker, storage)
        variants = {"e68": e68.PredictorPass(talker, storage), "new": predictor_pass.PredictorPass(talker, storage),
                    "e68_again": e68.PredictorPass(talker, storage)}
        # Agreement with the chain, codebooks 2..15 at 1 and 2 rows, each starting from the same cache.
        for batch in (1, 2):
            gen = torch.Generator(device=dev).manual_seed(batch)
            code = torch.randint(0, 2048, (batch,), generator=gen, device=dev)
            hidden0 = torch.randn(batch, talker.config.layers.hidden_size, generator=gen, device=dev).bfloat16()
            predictor_hidden(talker, 1, torch.stack([hidden0, talker.embed_codec(code)], dim=1), rope, memory)
            worst = {}
            for g in range(2, G):
                inp = predictor.embed(g - 1, code)[:, None]
                snap = storage.clone()
                chain = predictor.logits(g, predictor_hidden(talker, g, inp, rope, memory)).float()
                cache_chain = storage.clone()
                for name, one in [("head", committed)] + list(variants.items()):
                    storage.copy_(snap)
                    out = one.logits(g, inp[:, 0]).float()
                    cache = storage.clone()
                    w = worst.setdefault(name, {"max_abs": 0.0, "argmax_equal": 0, "cache_max_abs": 0.0})
                    w["max_abs"] = max(w["max_abs"], (out - chain).abs().max().item())
                    w["argmax_equal"] += int((out.argmax(-1) == chain.argmax(-1)).sum().item())
                    w["cache_max_abs"] = max(w["cache_max_abs"], (cache.float() - cache_chain.float()).abs().max().item())
                storage.copy_(cache_chain)
                code = chain.argmax(-1)
            emit(size=size, batch=batch, agreement=worst, picks=batch * (G - 2))
        # Time: the chain, the committed kernel, and each stage count, 14 calls in a graph.
        for batch in (1, 2):
            inp = predictor.embed(1, torch.zeros(batch, dtype=torch.long, device=dev))[:, None].contiguous()
            row = {"size": size, "batch": batch, "timing_us_14_calls": True,
                   "chain": timed(lambda: [predictor.logits(g, predictor_hidden(talker, g, inp, rope, memory)) for g in range(2, G)]),
                   "head": timed(lambda: [committed.logits(g, inp[:, 0]) for g in range(2, G)])}
            for s, v in variants.items():
                row[s] = timed(lambda: [v.logits(g, inp[:, 0]) for g in range(2, G)])
            row["head_again"] = timed(lambda: [committed.logits(g, inp[:, 0]) for g in range(2, G)])
            emit(**row)
    del model, talker, predictor, memory, committed, variants
    torch.cuda.empty_cache()

with open(out_path, "w") as f:
    json.dump(report, f, indent=1)
