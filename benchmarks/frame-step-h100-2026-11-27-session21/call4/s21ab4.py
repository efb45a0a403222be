"""Session 21, call 4: GPU-only A/B of the frame step in one process, against 8a904a6 (HEAD). Runners captured
with HEAD's frame sampler, frame code and sampling kernels (.devwork/fs_h4.py, fc_h4.py, sk_h4.py) and HEAD's
talker input (lookups and a sum) and RoPE (computed each step): "head"; the tree's sampler (the predictor's row
settings laid out by the codebook-0 kernel, its RoPE made only where the chain runs) with HEAD's talker input and
RoPE: "sampler"; the tree: "new" (the talker's input in one kernel, RoPE rows gathered from a table). Each
runner's two frame graphs replayed back to back, 50 frames per timing, five rounds interleaved."""
import importlib.util, json, statistics, sys, time
import torch
from benchmarks.frame_step import time_steps
from tts_service.engine.config import EngineConfig
from tts_service.model.checkpoint import LoadOptions, load_model
from tts_service.model.talker import Talker
from tts_service.runner import frame_step
from tts_service.runner.runner import ModelRunner


def load(name, path, stand_ins=()):
    """`path` as module `name`, its imports of the modules in `stand_ins` (real name -> module) answered by them."""
    saved = {real: sys.modules[real] for real, _ in stand_ins}
    sys.modules.update(dict(stand_ins))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    finally:
        sys.modules.update(saved)
    return module


sk_head = load("sk_h4", ".devwork/sk_h4.py")
fc_head = load("fc_h4", ".devwork/fc_h4.py")
fs_head = load("fs_h4", ".devwork/fs_h4.py", (("tts_service.runner.sampling_kernel", sk_head),
                                              ("tts_service.runner.frame_codes", fc_head)))
tree_call, tree_inputs, tree_hold = frame_step.FrameSampler.__call__, Talker.next_inputs, Talker.hold_rope_table


def head_inputs(self, frames, slots, text_ids):
    return self.embed_frame(frames[slots]) + self.embed_text(text_ids)


def configure(talker, sampler_is_new, talker_is_new):
    frame_step.FrameSampler.__call__ = tree_call if sampler_is_new else fs_head.FrameSampler.__call__
    Talker.next_inputs = tree_inputs if talker_is_new else head_inputs
    Talker.hold_rope_table = tree_hold if talker_is_new else (lambda self, *args: None)
    if not talker_is_new:
        talker.rope_table = None  # the new runner, built last, holds it (its graphs read it)


out_path = sys.argv[1]
sizes = sys.argv[2].split(",")
batches = [int(b) for b in sys.argv[3].split(",")]
report = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "results": []}
variants = {"head": (False, False), "sampler": (True, False), "new": (True, True)}


def emit(**row):
    report["results"].append(row)
    print(json.dumps(row), flush=True)
    json.dump(report, open(out_path, "w"), indent=1)


def device_ms_per_frame(runner, batch, frames=50):
    talker = runner.rows.talker_graphs[runner.bucket_for(batch)]
    sampling = runner.rows.sampling_graphs[runner.bucket_for(batch)]
    for _ in range(3):
        talker.replay(); sampling.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(frames):
        talker.replay(); sampling.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / frames


for size in sizes:
    model = load_model(f"random:{size}-custom_voice", LoadOptions.default_for("cuda"))
    context = 300
    blocks_per_row = -(-(context + 200) // 32)
    runners = {}
    for name, toggles in variants.items():
        configure(model.talker, *toggles)
        config = EngineConfig(max_running=max(batches), block_size=32, num_kv_blocks=max(batches) * blocks_per_row,
                              max_positions_per_request=blocks_per_row * 32, graph_batch_sizes=tuple(batches))
        runners[name] = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
    configure(model.talker, True, True)
    for batch in batches:
        for runner in runners.values():
            time_steps(runner, batch, context, 3)
        times = {name: [] for name in variants}
        for _ in range(5):
            for name, runner in runners.items():
                times[name].append(device_ms_per_frame(runner, batch))
        emit(size=size, batch=batch, device_ms=times, median_ms={n: statistics.median(t) for n, t in times.items()})
    del runners, model
    torch.cuda.empty_cache()
