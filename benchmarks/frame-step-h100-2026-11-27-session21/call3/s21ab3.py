"""Session 21, call 3: GPU-only A/B of the frame step in one process. Runners captured with HEAD's frame sampler
(.devwork/fs_head21.py: codebook 0's logit processing as a chain of small kernels, the slots' settings gathered,
`seen` updated and code 0 looked up by kernels of their own) or the tree's (one kernel for all of it); each
runner's two frame graphs replayed back to back, 50 frames per timing, five rounds interleaved."""
import importlib.util, json, statistics, sys, time
import torch
from benchmarks.frame_step import time_steps
from tts_service.engine.config import EngineConfig
from tts_service.model.checkpoint import LoadOptions, load_model
from tts_service.runner import frame_step
from tts_service.runner.runner import ModelRunner


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


fs_head = load("fs_head21", ".devwork/fs_head21.py")
out_path = sys.argv[1]
sizes = sys.argv[2].split(",")
batches = [int(b) for b in sys.argv[3].split(",")]
report = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "results": []}
tree_call = frame_step.FrameSampler.__call__
variants = {"head": fs_head.FrameSampler.__call__, "new": tree_call}


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
    for name, call in variants.items():
        frame_step.FrameSampler.__call__ = call
        config = EngineConfig(max_running=max(batches), block_size=32, num_kv_blocks=max(batches) * blocks_per_row,
                              max_positions_per_request=blocks_per_row * 32, graph_batch_sizes=tuple(batches))
        runners[name] = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
    frame_step.FrameSampler.__call__ = tree_call
    for batch in batches:
        for runner in runners.values():
            time_steps(runner, batch, context, 3)
        times = {name: [] for name in variants}
        for _ in range(5):
            for name, runner in runners.items():
                times[name].append(device_ms_per_frame(runner, batch))
        emit(size=size, batch=batch, device_ms=times, median_ms={n: statistics.median(t) for n, t in times.items()},
             host_timed_ms={n: statistics.median(time_steps(r, batch, context, 30)) * 1e3 for n, r in runners.items()})
    del runners, model
    torch.cuda.empty_cache()
