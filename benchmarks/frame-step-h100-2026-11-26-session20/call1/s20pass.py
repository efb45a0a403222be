"""Session 20 probe: the predictor kernel with other barrier forms (see s20bar.py) against the committed one, in
CUDA graphs over codebooks 2..15 at 1 and 2 rows, both sizes; logits and cache compared with the committed
kernel's (the barrier changes no arithmetic: they must be equal bit for bit)."""
import importlib.util, json, statistics, sys, time
import torch
from tts_service.model.checkpoint import LoadOptions, load_model
from tts_service.model.layers import use_fused_kernels
from tts_service.runner.frame_codes import predictor_hidden
from tts_service.runner.frame_step import PagedPredictorCache
from tts_service.runner import predictor_pass

out_path = sys.argv[1]
sizes = sys.argv[2].split(",")
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


OLD_ARRIVE = '''        tl.debug_barrier()
        tl.atomic_add(arrivals_ptr, 1, sem="release", scope="gpu")'''
RED_ARRIVE = '''        tl.debug_barrier()
        tl.inline_asm_elementwise(
            """{ .reg .pred %p_s; .reg .u32 %t_s;
            mov.u32 %t_s, %tid.x; setp.ne.u32 %p_s, %t_s, 0;
            @!%p_s red.release.gpu.global.add.u32 [$1], 1;
            mov.u32 $0, 0; }""", "=r,l", [arrivals_ptr], dtype=tl.int32, is_pure=False, pack=1)'''
OLD_WAIT = '''        seen = tl.load(arrivals_ptr, volatile=True)
        while seen < target:
            seen = tl.load(arrivals_ptr, volatile=True)
        tl.atomic_add(arrivals_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()'''


def one_thread_wait(load):
    return '''        tl.inline_asm_elementwise(
            """{ .reg .pred %p_s; .reg .u32 %t_s; .reg .s32 %v_s;
            mov.u32 %t_s, %tid.x; setp.ne.u32 %p_s, %t_s, 0;
            @%p_s bra DONE_S;
            WAIT_S: LOAD %v_s, [$1];
            setp.lt.s32 %p_s, %v_s, $2;
            @%p_s bra WAIT_S;
            DONE_S: mov.u32 $0, 0; }""", "=r,l,r", [arrivals_ptr, target], dtype=tl.int32, is_pure=False, pack=1)
        tl.debug_barrier()'''.replace("LOAD", load)


variants = {
    "acquire1": patched("pp_acquire1", [(OLD_WAIT, one_thread_wait("ld.acquire.gpu.global.s32"))]),
    "red_acquire1": patched("pp_red_acquire1", [(OLD_ARRIVE, RED_ARRIVE),
                                                (OLD_WAIT, one_thread_wait("ld.acquire.gpu.global.s32"))]),
    "red_volatile1": patched("pp_red_volatile1", [(OLD_ARRIVE, RED_ARRIVE),
                                                  (OLD_WAIT, one_thread_wait("ld.volatile.global.s32"))]),
}
report = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "results": []}


def emit(**row):
    report["results"].append(row)
    print(json.dumps(row), flush=True)
    json.dump(report, open(out_path, "w"), indent=1)


def graph_of(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(); fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def replay_us(graph, replays=30):
    graph.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(replays):
        graph.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1000 / replays


for size in sizes:
    model = load_model(f"random:{size}-custom_voice", LoadOptions.default_for("cuda"))
    talker = model.talker
    use_fused_kernels(talker, True)
    predictor = talker.code_predictor
    G = talker.config.num_code_groups
    memory = PagedPredictorCache(talker, 4, torch.bfloat16, dev)
    rope = predictor.rope_table(G, torch.bfloat16)
    storage = memory.cache.storage
    with torch.inference_mode():
        passes = {"committed": predictor_pass.PredictorPass(talker, storage)}
        passes.update({name: module.PredictorPass(talker, storage) for name, module in variants.items()})
        for batch in (1, 2):
            gen = torch.Generator(device=dev).manual_seed(batch)
            code = torch.randint(0, 2048, (batch,), generator=gen, device=dev)
            hidden0 = torch.randn(batch, talker.config.layers.hidden_size, generator=gen, device=dev).bfloat16()
            predictor_hidden(talker, 1, torch.stack([hidden0, talker.embed_codec(code)], dim=1), rope, memory)
            equal = {name: True for name in passes}
            for g in range(2, G):
                inp = predictor.embed(g - 1, code)[:, None]
                snap = storage.clone()
                outs = {}
                for name, one in passes.items():
                    storage.copy_(snap)
                    outs[name] = (one.logits(g, inp[:, 0]).clone(), storage.clone())
                for name, (logits, cache) in outs.items():
                    equal[name] &= bool(torch.equal(logits, outs["committed"][0])
                                        and torch.equal(cache, outs["committed"][1]))
                code = outs["committed"][0].argmax(-1)
            inp = predictor.embed(1, torch.zeros(batch, dtype=torch.long, device=dev))[:, None].contiguous()
            graphs = {name: graph_of(lambda one=one: [one.logits(g, inp[:, 0]) for g in range(2, G)])
                      for name, one in passes.items()}
            times = {name: [] for name in graphs}
            for _ in range(7):
                for name, graph in graphs.items():
                    times[name].append(replay_us(graph))
            emit(size=size, batch=batch, equal_to_committed=equal,
                 median_us_14_calls={n: round(statistics.median(t), 1) for n, t in times.items()},
                 rounds={n: [round(x, 1) for x in t] for n, t in times.items()})
    del model, talker, predictor, memory, passes
    torch.cuda.empty_cache()
