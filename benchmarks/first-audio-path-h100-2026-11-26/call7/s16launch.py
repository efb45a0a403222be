"""Session 16 probe: the host time of queueing one decode step, piece by piece (1.7B, random weights, graphs):
the rows' loads, the talker's block tables and positions, the talker graph's replay, and the sampling graph's
replay, each timed with the device idle before it (so no launch waits for a full queue). Writes JSON to argv[1]."""
import json
import statistics
import sys
import time

import torch

from tts_service.engine import Engine, EngineConfig
from tts_service.model.checkpoint import LoadOptions, load_model
from tts_service.runner.runner import DecodeInput, _block_tables

model = load_model("random:1.7b-custom_voice", LoadOptions.default_for("cuda"))
engine = Engine.create(model, EngineConfig(max_running=128, max_positions_per_request=1024))
runner = engine.runner
results = {}
for batch in (1, 16, 32, 128):
    decodes = tuple(DecodeInput(slot=i, block_ids=(2 * i, 2 * i + 1), position=20, frame_index=3,
                                text_id=runner.tts_pad_id) for i in range(batch))
    times = {"rows": [], "metadata": [], "talker_replay": [], "sampling_replay": [], "whole": []}
    for iteration in range(60):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        runner._load_rows(0, [(d.slot, d.text_id, d.frame_index) for d in decodes])
        t1 = time.perf_counter()
        runner.decode_backend.set_metadata(_block_tables([d.block_ids for d in decodes]),
                                           torch.tensor([d.position for d in decodes], dtype=torch.int64))
        t2 = time.perf_counter()
        runner.rows.talker_graphs[runner.bucket_for(batch)].replay()
        t3 = time.perf_counter()
        runner._sample_frames(batch, (), None)
        t4 = time.perf_counter()
        torch.cuda.synchronize()
        runner._start_decodes(decodes)
        runner._sample_frames(batch, (), None)
        t5 = time.perf_counter()
        if iteration >= 10:
            for name, seconds in (("rows", t1 - t0), ("metadata", t2 - t1), ("talker_replay", t3 - t2),
                                  ("sampling_replay", t4 - t3), ("whole", t5 - t4)):
                times[name].append(seconds * 1e3)
    results[batch] = {name: statistics.median(values) for name, values in times.items()}
    print(batch, " ".join(f"{name} {value:.3f}" for name, value in results[batch].items()), "ms (median)")
json.dump({"probe": "s16launch", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "host_ms_median": results}, open(sys.argv[1], "w"), indent=1)
