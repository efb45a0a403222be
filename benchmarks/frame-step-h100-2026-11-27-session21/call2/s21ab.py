"""Session 21: GPU-only A/B of the frame step in one process. Runners captured with HEAD's predictor kernel and
frame code (.devwork/pp_head21.py, fc_head21.py: codebook 1 through the layer chain, a lookup kernel for each next
input), with codebook 1 through the tree's kernel but the lookups kept ("cb1"), or the tree (codebook 1 in the
kernel, the sampling kernel copying the next input's embedding: "new"); each runner's two frame graphs replayed
back to back, 50 frames per timing, five rounds interleaved."""
import importlib.util, json, statistics, sys, time
import torch
from benchmarks.frame_step import time_steps
from tts_service.engine.config import EngineConfig
from tts_service.model.checkpoint import LoadOptions, load_model
from tts_service.runner import frame_codes, frame_step
from tts_service.runner.runner import ModelRunner
from tts_service.runner.sampling import draws_in_kernel, gumbel_noise, sample


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


pp_head = load("pp_head21", ".devwork/pp_head21.py")
fc_head = load("fc_head21", ".devwork/fc_head21.py")


def cb1_with_lookups(talker, talker_hidden, code0, rows, seeds, first_draw, memory, one_call=None):
    predictor = talker.code_predictor
    inputs = torch.stack([talker_hidden, talker.embed_codec(code0)], dim=1)
    num_groups = talker.config.num_code_groups
    draws = first_draw[:, None] + torch.arange(1, num_groups, device=code0.device)
    gumbel = None
    codes = []
    rope = predictor.rope_table(num_groups, inputs.dtype)
    for codebook in range(1, num_groups):
        if one_call is not None and one_call.applies_to(inputs.shape[0] * inputs.shape[1]):
            scores = one_call.logits(codebook, inputs)
        else:
            scores = predictor.logits(codebook, frame_codes.predictor_hidden(talker, codebook, inputs, rope,
                                                                             memory)).float()
        if gumbel is None and not draws_in_kernel(scores):
            gumbel = gumbel_noise(seeds, draws, scores.shape[-1])
        code = sample(scores, rows, seeds, draws[:, codebook - 1], None if gumbel is None else gumbel[:, codebook - 1])
        codes.append(code)
        inputs = predictor.embed(codebook, code)[:, None]
    return torch.stack(codes, dim=1)


out_path = sys.argv[1]
sizes = sys.argv[2].split(",")
batches = [int(b) for b in sys.argv[3].split(",")]
report = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "results": []}
tree = (frame_step.PredictorPass, frame_step.predict_remaining_codebooks)
variants = {"head": (pp_head.PredictorPass, fc_head.predict_remaining_codebooks),
            "cb1": (tree[0], cb1_with_lookups), "new": tree}
if len(sys.argv) > 4:
    variants = {name: variants[name] for name in sys.argv[4].split(",")}


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
    for name, (pass_class, predict) in variants.items():
        frame_step.PredictorPass, frame_step.predict_remaining_codebooks = pass_class, predict
        config = EngineConfig(max_running=max(batches), block_size=32, num_kv_blocks=max(batches) * blocks_per_row,
                              max_positions_per_request=blocks_per_row * 32, graph_batch_sizes=tuple(batches))
        runners[name] = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
    frame_step.PredictorPass, frame_step.predict_remaining_codebooks = tree
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
