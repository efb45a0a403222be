"""Session 20, call 3: GPU-only A/B of the frame step in one process. Runners captured with the tree's predictor
kernel (its barrier counter never reset, no copy barrier without an input projection) or 36d0d5a's
(.devwork/pp_36d.py); the tree's decode attention (first tile loaded before the query) launched as a programmatic
dependent with qk_norm_rope, or both launched plainly, or 36d0d5a's decode attention (.devwork/kv_36d.py); each
runner's two frame graphs replayed back to back, 50 frames per timing, five rounds interleaved."""
import importlib.util, json, statistics, sys, time
import torch
from benchmarks.frame_step import time_steps
from tts_service.engine.config import EngineConfig
from tts_service.model.checkpoint import LoadOptions, load_model
from tts_service.model import fused_ops
from tts_service.runner import frame_step, kv_cache
from tts_service.runner.runner import ModelRunner


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


pp_head = load("pp_36d", ".devwork/pp_36d.py")
kv_head = load("kv_36d", ".devwork/kv_36d.py")
out_path = sys.argv[1]
sizes = sys.argv[2].split(",")
batches = [int(b) for b in sys.argv[3].split(",")]
report = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "results": []}
tree_pass, tree_attention = frame_step.PredictorPass, kv_cache.decode_attention_triton
tree_early, tree_init = fused_ops.launches_early, kv_cache.PagedDecodeBackend.__init__


def emit(**row):
    report["results"].append(row)
    print(json.dumps(row), flush=True)
    json.dump(report, open(out_path, "w"), indent=1)


def configure(new_pass: bool, attention: str) -> None:
    """attention: "early" (the tree's, PDL on it and qk_norm_rope), "plain" (the tree's, no PDL), "head"."""
    frame_step.PredictorPass = tree_pass if new_pass else pp_head.PredictorPass
    fused_ops.launches_early = tree_early if attention == "early" else (lambda device: False)
    kv_cache.decode_attention_triton = (tree_attention if attention != "head"
                                        else (lambda *args: kv_head.decode_attention_triton(*args[:9])))

    def init(self, *args, **kwargs):
        tree_init(self, *args, **kwargs)
        self.launches_early = self.launches_early and attention == "early"

    kv_cache.PagedDecodeBackend.__init__ = init


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


variants = {"new": (True, "early"), "attention_plain": (True, "plain"), "attention_head": (True, "head"),
            "pass_head": (False, "early"), "head": (False, "head")}
if len(sys.argv) > 4:
    variants = {name: variants[name] for name in sys.argv[4].split(",")}
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
    configure(True, "early")
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
