"""Probe (reverted after its one run, kept in history): the frame step's device time alone and beside a forced
aligner that aligns without pause, the GPU's SMs shared (as the server runs) or split between two green contexts
(the engine's streams on one, the aligner's on the other).

    python3 benchmarks/sm_split_probe.py shared|split:N OUT.json  (needs cuda-bindings 13)
"""
import json
import statistics
import sys
import threading
import time
import types

import numpy as np
import torch

from tts_service.engine.config import EngineConfig
from tts_service.model.aligner import AlignmentItem, ForcedAligner
from tts_service.model.checkpoint import LoadOptions
from tts_service.model.loading import load_model
from tts_service.runner.aligner_runner import AlignerRunner
from tts_service.runner.params import GenerationParams
from tts_service.runner.runner import DecodeInput, ModelRunner

mode, out = sys.argv[1], sys.argv[2]
ROWS = (1, 8, 16)
torch.cuda.init()
total_sms = torch.cuda.get_device_properties(0).multi_processor_count


def check(result):
    err, *rest = result
    assert int(err) == 0, err
    return rest[0] if len(rest) == 1 else rest


def green_streams(num_aligner_sms):
    from cuda.bindings import driver as d
    check(d.cuInit(0))
    dev = check(d.cuDeviceGet(0))
    whole = check(d.cuDeviceGetDevResource(dev, d.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))
    groups, _, rest = check(d.cuDevSmResourceSplitByCount(1, whole, 0, num_aligner_sms))
    made = []
    for resource, priority, count in ((groups[0], 0, 1), (rest, -1, 2)):
        desc = check(d.cuDevResourceGenerateDesc([resource], 1))
        context = check(d.cuGreenCtxCreate(desc, dev, d.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))
        streams = [torch.cuda.ExternalStream(int(check(d.cuGreenCtxStreamCreate(
            context, d.CUstream_flags.CU_STREAM_NON_BLOCKING, priority))), device="cuda:0") for _ in range(count)]
        made.append((context, streams, resource.sm.smCount))
    return made


keep = []
engine_sms = total_sms
if mode.startswith("split:"):
    (a_ctx, a_streams, a_sms), (e_ctx, e_streams, e_sms) = green_streams(int(mode.split(":")[1]))
    keep += [a_ctx, e_ctx]
    engine_sms = e_sms
    sys.stdout.write(f"aligner {a_sms} SMs, engine {e_sms} SMs of {total_sms}\n")
real_stream, real_props = torch.cuda.Stream, torch.cuda.get_device_properties


def props_with(num_sms):
    def get(device=None):
        props = real_props(device)
        return types.SimpleNamespace(**{name: getattr(props, name) for name in dir(props) if not name.startswith("_")}
                                     | {"multi_processor_count": num_sms})
    return get


def build(thunk, streams, num_sms):
    pending = list(streams)
    if streams:
        torch.cuda.Stream = lambda *a, **k: pending.pop(0) if pending else real_stream(*a, **k)
        torch.cuda.get_device_properties = props_with(num_sms)
    try:
        return thunk()
    finally:
        torch.cuda.Stream, torch.cuda.get_device_properties = real_stream, real_props


split = mode.startswith("split:")
model = load_model("random:1.7b-custom_voice", LoadOptions.default_for("cuda"))
context = 300
blocks_per_row = -(-(context + 200) // 32)
config = EngineConfig(max_running=max(ROWS), block_size=32, num_kv_blocks=max(ROWS) * blocks_per_row,
                      max_positions_per_request=blocks_per_row * 32, graph_batch_sizes=ROWS)
runner = build(lambda: ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz)),
               e_streams if split else [], engine_sms)
aligner = build(lambda: AlignerRunner(ForcedAligner.load("random:0.6b", "cuda", torch.bfloat16)),
                a_streams if split else [], total_sms - engine_sms if split else total_sms)
sys.stdout.write(f"streams: frame {runner.frame_stream} aligner {aligner.stream}\n")

rng = np.random.default_rng(0)
words = "the quick brown fox jumps over a lazy dog while seven bright birds sing".split()  # noqa: SIM905
clips = [AlignmentItem(rng.standard_normal(24000 * 4).astype(np.float32) * 0.1, 24000,
                       " ".join(words[i % len(words)] for i in range(10)) + ".") for _ in range(8)]
aligner.align_many(clips)


def aligner_ms(repeats=10):
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        started = time.perf_counter()
        aligner.align_many(clips)
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def prepare(batch):
    runner.state.assign(list(range(batch)), [GenerationParams(seed=slot) for slot in range(batch)])
    runner.state.last_frame.random_(0, 2048)
    step = tuple(DecodeInput(slot, tuple(range(slot * blocks_per_row, (slot + 1) * blocks_per_row)), context, 5, 0)
                 for slot in range(batch))
    for _ in range(3):
        runner._decode(step)
    torch.cuda.synchronize()


def frame_ms(batch, frames=40, runs=7):
    values = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(frames):
            runner.replay_decode(batch)
        end.record()
        end.synchronize()
        values.append(start.elapsed_time(end) / frames)
    return statistics.median(values), max(values)


results = {"mode": mode, "device": torch.cuda.get_device_name(), "engine_sms": engine_sms, "total_sms": total_sms,
           "aligner_alone_ms": aligner_ms(), "rows": {}}
stop = threading.Event()
aligned = []


def keep_aligning():
    while not stop.is_set():
        started = time.perf_counter()
        aligner.align_many(clips)
        aligned.append((time.perf_counter() - started) * 1e3)


for batch in ROWS:
    prepare(batch)
    alone = frame_ms(batch)
    stop.clear()
    aligned.clear()
    worker = threading.Thread(target=keep_aligning)
    worker.start()
    time.sleep(0.2)
    beside = frame_ms(batch)
    stop.set()
    worker.join()
    results["rows"][batch] = {"alone_ms": alone, "beside_aligner_ms": beside,
                              "aligner_batch_ms_beside": statistics.median(aligned) if aligned else None,
                              "aligner_batches": len(aligned)}
    sys.stdout.write(f"{mode} rows {batch}: alone {alone[0]:.2f} ms, beside the aligner {beside[0]:.2f} ms "
                     f"(max {beside[1]:.2f}); aligner batch {results['rows'][batch]['aligner_batch_ms_beside']} ms\n")
sys.stdout.write(f"aligner alone {results['aligner_alone_ms']:.1f} ms a batch of 8 x 4 s\n")
with open(out, "w") as file:
    json.dump(results, file, indent=1)
