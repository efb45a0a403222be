"""Session 19, in-process A/B of the frame step: one model, four runners captured with the packed frame table
and the attention's splits combined by their last program each on or off, their steps timed interleaved (three
rounds)."""
import importlib.util, json, statistics, sys, time
import torch
from benchmarks.frame_step import time_steps
from tts_service.engine.config import EngineConfig
from tts_service.model import fused_ops, row_projections
from tts_service.model.checkpoint import LoadOptions, load_model
from tts_service.model.talker import Talker
from tts_service.runner import kv_cache
from tts_service.runner.runner import ModelRunner

out_path = sys.argv[1]
sizes = sys.argv[2].split(",")
batches = [int(b) for b in sys.argv[3].split(",")]
report = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "results": []}
original_init = kv_cache.PagedDecodeBackend.__init__
original_pack = Talker.pack_projections


def emit(**row):
    report["results"].append(row)
    print(json.dumps(row), flush=True)
    json.dump(report, open(out_path, "w"), indent=1)


def configure(pack: bool, combine: bool) -> None:
    Talker.pack_projections = original_pack if pack else (lambda self: None)

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        if not combine:
            self.split_arrivals = None

    kv_cache.PagedDecodeBackend.__init__ = init


variants = {"new": (True, True), "no_pack": (False, True), "no_combine": (True, False), "neither": (False, False)}
for size in sizes:
    model = load_model(f"random:{size}-custom_voice", LoadOptions.default_for("cuda"))
    context, iterations = 300, 40
    blocks_per_row = -(-(context + 3 * 4 * (iterations + 3) + 16) // 32)
    runners = {}
    packed_table = None
    for name, (pack, combine) in variants.items():
        configure(pack, combine)
        if not pack and model.talker.frame_table is not None:
            packed_table = model.talker.frame_table
            model.talker.frame_table = None  # captured through the sixteen modules' views of the same rows
        config = EngineConfig(max_running=max(batches), block_size=32, num_kv_blocks=max(batches) * blocks_per_row,
                              max_positions_per_request=blocks_per_row * 32, graph_batch_sizes=tuple(batches))
        runners[name] = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
        if packed_table is not None:
            model.talker.frame_table = packed_table
        emit(size=size, variant=name, frame_table_packed=model.talker.frame_table is not None and pack)
    configure(True, True)
    for batch in batches:
        times = {name: [] for name in variants}
        for _ in range(3):
            for name, runner in runners.items():
                times[name].append(statistics.median(time_steps(runner, batch, context, iterations)) * 1e3)
        emit(size=size, batch=batch, step_ms=times, median_ms={n: statistics.median(t) for n, t in times.items()})
    del runners, model
    torch.cuda.empty_cache()

