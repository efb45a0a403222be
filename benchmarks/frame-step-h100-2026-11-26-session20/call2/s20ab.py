"""Session 20, GPU-only A/B of the frame step in one process: runners captured with the predictor kernel's
one-thread barrier (the tree) or HEAD's (.devwork/pp_head20.py), and the sampling kernel's two-bit select and
greedy branch (the tree) or HEAD's (.devwork/sk_head.py); each runner's two frame graphs replayed back to back, 50
frames per timing, five rounds interleaved. The host runs ahead of the device: the device's time per frame."""
import importlib.util, json, statistics, sys, time
import torch
from benchmarks.frame_step import time_steps
from tts_service.engine.config import EngineConfig
from tts_service.model.checkpoint import LoadOptions, load_model
from tts_service.runner import frame_step, sampling_kernel
from tts_service.runner.runner import ModelRunner


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pp_head = load("pp_head20", ".devwork/pp_head20.py")
sk_head = load("sk_head", ".devwork/sk_head.py")
out_path = sys.argv[1]
sizes = sys.argv[2].split(",")
batches = [int(b) for b in sys.argv[3].split(",")]
report = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "results": []}
tree_pass, tree_sample = frame_step.PredictorPass, sampling_kernel.sample_rows


def emit(**row):
    report["results"].append(row)
    print(json.dumps(row), flush=True)
    json.dump(report, open(out_path, "w"), indent=1)


def configure(new_pass: bool, new_sampling: bool) -> None:
    frame_step.PredictorPass = tree_pass if new_pass else pp_head.PredictorPass
    sampling_kernel.sample_rows = tree_sample if new_sampling else sk_head.sample_rows


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


variants = {"new": (True, True), "head_pass": (False, True), "head_sampling": (True, False), "head": (False, False)}
for size in sizes:
    model = load_model(f"random:{size}-custom_voice", LoadOptions.default_for("cuda"))
    context = 300
    blocks_per_row = -(-(context + 200) // 32)
    runners = {}
    for name, toggles in variants.items():
        configure(*toggles)
        config = EngineConfig(max_running=max(batches), block_size=32, num_kv_blocks=max(batches) * blocks_per_row,
                              max_positions_per_request=blocks_per_row * 32, graph_batch_sizes=tuple(batches))
        runners[name] = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
    configure(True, True)
    for batch in batches:
        for runner in runners.values():
            time_steps(runner, batch, context, 3)  # sets each runner's metadata for this batch
        times = {name: [] for name in variants}
        for _ in range(5):
            for name, runner in runners.items():
                times[name].append(device_ms_per_frame(runner, batch))
        emit(size=size, batch=batch, device_ms=times, median_ms={n: statistics.median(t) for n, t in times.items()},
             host_timed_ms={n: statistics.median(time_steps(r, batch, context, 30)) * 1e3 for n, r in runners.items()})
    del runners, model
    torch.cuda.empty_cache()
