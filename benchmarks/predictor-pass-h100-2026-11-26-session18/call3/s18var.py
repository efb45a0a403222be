"""Session 18 probe: the predictor kernel with the held keys/values and residual rows loaded early, and with 512/256-column chunks (256: a tile row in one warp)
against the committed kernel (dc4eea4, .devwork/pp_head.py) and the layer chain, in CUDA graphs over codebooks
2..15; its agreement with the chain; and, from patched copies that stamp %globaltimer at every barrier, where
a call's time goes phase by phase."""
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


STAMP = 'tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)'
STAMPS = "(arrivals_ptr + 64).to(tl.pointer_type(tl.int64), bitcast=True)"
PAIRS = [
    ('''        tl.debug_barrier()
        tl.atomic_add(arrivals_ptr, 1, sem="release", scope="gpu")''',
     f'''        arrive_time = {STAMP}
        tl.debug_barrier()
        old = tl.atomic_add(arrivals_ptr, 1, sem="release", scope="gpu")
        tl.atomic_max({STAMPS} + 2 * (old // tl.num_programs(0) + 1), arrive_time)'''),
    ('''        tl.atomic_add(arrivals_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()
''',
     f'''        tl.atomic_add(arrivals_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()
        exit_time = {STAMP}
        if tl.program_id(0) == 0:
            tl.store({STAMPS} + 2 * (target // tl.num_programs(0)) + 1, exit_time)
'''),
    ('''        arrived = 0
''', f'''        arrived = 0
        if program == 0:
            tl.store({STAMPS}, {STAMP})
'''),
]


def stamped_copy(name, path):
    text = open(path).read()
    for old, new in PAIRS:
        assert old in text, (name, old)
        text = text.replace(old, new)
    text = text.rstrip("\n") + f"\n        tl.atomic_max({STAMPS} + 1, {STAMP})\n"
    open(f"/tmp/{name}.py", "w").write(text)
    return load(name, f"/tmp/{name}.py")


def chunked(chunk):
    """The working tree's module with its largest chunk set to `chunk` (256 puts a tile row in one warp)."""
    return patched(f"pp_chunk{chunk}", [("_MAX_CHUNK = 1024", f"_MAX_CHUNK = {chunk}")])


chunk_modules = {chunk: chunked(chunk) for chunk in (512, 256)}
stamped_modules = {"head": (stamped_copy("pp_head_stamped", ".devwork/pp_head.py"), 8),
                   "new": (stamped_copy("pp_new_stamped", predictor_pass.__file__), 8),
                   "c256_t8": (stamped_copy("pp_c256_stamped", "/tmp/pp_chunk256.py"), 8),
                   "c256_t16": (stamped_copy("pp_c256_stamped16", "/tmp/pp_chunk256.py"), 16)}
head = load("pp_head", ".devwork/pp_head.py")
report = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "results": []}


def emit(**row):
    report["results"].append(row)
    print(json.dumps(row), flush=True)


PHASES = ["input"] + [f"l{layer}_{name}" for layer in range(5) for name in ("qkv", "attention", "o", "gate_up", "down")] + ["head"]
for size in ("1.7b", "0.6b"):
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
        variants = {"new": predictor_pass.PredictorPass(talker, storage),
                    "c512_t8": chunk_modules[512].PredictorPass(talker, storage),
                    "c256_t8": chunk_modules[256].PredictorPass(talker, storage),
                    "c256_t16": chunk_modules[256].PredictorPass(talker, storage, tile_rows=16),
                    "c256_t32": chunk_modules[256].PredictorPass(talker, storage, tile_rows=32)}
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
        for batch in (1, 2, 4):
            inp = predictor.embed(1, torch.zeros(batch, dtype=torch.long, device=dev))[:, None].contiguous()
            row = {"size": size, "batch": batch, "timing_us_14_calls": True,
                   "chain": timed(lambda: [predictor.logits(g, predictor_hidden(talker, g, inp, rope, memory)) for g in range(2, G)]),
                   "head": timed(lambda: [committed.logits(g, inp[:, 0]) for g in range(2, G)])}
            for s, v in variants.items():
                row[s] = timed(lambda: [v.logits(g, inp[:, 0]) for g in range(2, G)])
            row["head_again"] = timed(lambda: [committed.logits(g, inp[:, 0]) for g in range(2, G)])
            emit(**row)
        # Phases: the stamped copies, one row, eager calls, 5 rounds of codebooks 2..15.
        for s, (module, tile_rows) in stamped_modules.items():
            stamped = module.PredictorPass(talker, storage, tile_rows=tile_rows)
            stamped.arrivals = torch.zeros(256, dtype=torch.int32, device=dev)
            inp = predictor.embed(1, torch.zeros(1, dtype=torch.long, device=dev))[:, None].contiguous()
            phase_ns = [[] for _ in PHASES]
            barrier_ns = [[] for _ in range(len(PHASES) - 1)]
            totals = []
            for round_ in range(6):
                for g in range(2, G):
                    stamped.logits(g, inp[:, 0])
                    torch.cuda.synchronize()
                    st = stamped.arrivals[64:64 + 4 * (len(PHASES) + 1)].view(torch.int64).tolist()
                    if round_ == 0:
                        continue
                    start, end = st[0], st[1]
                    arrive = [st[2 * k] for k in range(1, len(PHASES))]
                    exit_ = [st[2 * k + 1] for k in range(1, len(PHASES))]
                    bounds = [start] + exit_
                    for k in range(len(PHASES)):
                        stop = arrive[k] if k < len(arrive) else end
                        phase_ns[k].append(stop - bounds[k])
                    for k in range(len(arrive)):
                        barrier_ns[k].append(exit_[k] - arrive[k])
                    totals.append(end - start)
            emit(size=size, kernel=s, phases_us={p: statistics.median(v) / 1000 for p, v in zip(PHASES, phase_ns)},
                 barriers_us=[statistics.median(v) / 1000 for v in barrier_ns],
                 call_us=statistics.median(totals) / 1000)
    del model, talker, predictor, memory, committed, variants
    torch.cuda.empty_cache()

with open(out_path, "w") as f:
    json.dump(report, f, indent=1)
