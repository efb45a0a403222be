"""Session 17, call 11 probe: does stacking the predictor's weights (PredictorPass's constructor) slow the layer
chain at large batch? The frame step of 2a80f82's runner at 4 and 128 rows, twice; then the weights stacked by this
tree's module and the graphs captured again; twice more."""
import importlib.util, json, statistics, sys
import torch
from benchmarks.frame_step import time_steps
from tts_service.engine.config import EngineConfig
from tts_service.model.checkpoint import LoadOptions, load_model
from tts_service.runner.runner import ModelRunner

new_module_path, out_path = sys.argv[1], sys.argv[2]
model = load_model("random:1.7b-custom_voice", LoadOptions.default_for("cuda"))
config = EngineConfig(max_running=128, block_size=32, num_kv_blocks=128 * 12, max_positions_per_request=12 * 32,
                      graph_batch_sizes=(4, 128))
runner = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
rows = []
def measure(label):
    for batch in (4, 128):
        ms = statistics.median(time_steps(runner, batch, 300, 50)) * 1e3
        rows.append({"label": label, "batch": batch, "step_ms": ms})
        print(label, batch, round(ms, 3), flush=True)
measure("separate-1"); measure("separate-2")
spec = importlib.util.spec_from_file_location("pp_new", new_module_path)
pp = importlib.util.module_from_spec(spec); spec.loader.exec_module(pp)
pp.PredictorPass(model.talker, runner.sampler.predictor_cache.cache.storage)
runner._capture_graphs()
measure("stacked-1"); measure("stacked-2")
json.dump(rows, open(out_path, "w"), indent=1)
