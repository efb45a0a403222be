"""Session 19, GPU-only A/B of the frame step: one model, runners captured with the projections launched as
programmatic dependents (PDL), the packed frame table and the attention's in-kernel combine each on or off; each
runner's two frame graphs (talker, sampling) replayed back to back, 50 frames per timing, five rounds interleaved.
The host runs ahead of the device here, so the figure is the device's time per frame."""
import json, statistics, sys, time
import torch
from benchmarks.frame_step import time_steps
from tts_service.engine.config import EngineConfig
from tts_service.model import row_projections
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
original_early = row_projections.launches_early


def emit(**row):
    report["results"].append(row)
    print(json.dumps(row), flush=True)
    json.dump(report, open(out_path, "w"), indent=1)


def configure(pdl: bool, pack: bool, combine: bool) -> None:
    row_projections.launches_early = original_early if pdl else (lambda device: False)
    Talker.pack_projections = original_pack if pack else (lambda self: None)

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        if not combine:
            self.split_arrivals = None

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


variants = {"new": (True, True, True), "no_pdl": (False, True, True), "pdl_only": (True, False, False),
            "none": (False, False, False)}
for size in sizes:
    model = load_model(f"random:{size}-custom_voice", LoadOptions.default_for("cuda"))
    context = 300
    blocks_per_row = -(-(context + 200) // 32)
    runners, packed_table = {}, None
    for name, (pdl, pack, combine) in variants.items():
        configure(pdl, pack, combine)
        if not pack and model.talker.frame_table is not None:
            packed_table = model.talker.frame_table
            model.talker.frame_table = None
        config = EngineConfig(max_running=max(batches), block_size=32, num_kv_blocks=max(batches) * blocks_per_row,
                              max_positions_per_request=blocks_per_row * 32, graph_batch_sizes=tuple(batches))
        runners[name] = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
        if packed_table is not None:
            model.talker.frame_table = packed_table
    configure(True, True, True)
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
