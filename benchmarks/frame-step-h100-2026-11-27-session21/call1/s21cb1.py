"""Session 21: what the predictor's first call (codebook 1: talker hidden + code 0's embedding, two tokens) costs
through the layer chain, against one predictor-pass call (codebook 2) and the sampling kernel, each captured in a
CUDA graph and replayed 200 times, five rounds; device us per call."""
import json, statistics, sys, time
import torch
from tts_service.engine.config import EngineConfig
from tts_service.model.checkpoint import LoadOptions, load_model
from tts_service.runner.frame_codes import predictor_hidden
from tts_service.runner.runner import ModelRunner

out_path = sys.argv[1]
report = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "results": []}


def timed(fn, reps=200):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):
            fn()
    graph.replay(); torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps // 10):
            graph.replay()
        end.record(); end.synchronize()
        rounds.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(rounds)


for size in sys.argv[2].split(","):
    model = load_model(f"random:{size}-custom_voice", LoadOptions.default_for("cuda"))
    config = EngineConfig(max_running=2, block_size=32, num_kv_blocks=64, max_positions_per_request=512,
                          graph_batch_sizes=(1, 2))
    runner = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
    talker, sampler = runner.talker, runner.sampler
    memory, one_call = sampler.predictor_cache, sampler.predictor_call
    predictor = talker.code_predictor
    width = talker.config.layers.hidden_size
    with torch.inference_mode():
        for batch in (1, 2):
            inputs = torch.randn(batch, 2, width, dtype=runner.dtype, device="cuda") * 0.5
            rope = predictor.rope_table(talker.config.num_code_groups, inputs.dtype)
            chain = lambda: predictor.logits(1, predictor_hidden(talker, 1, inputs, rope, memory)).float()
            one = lambda: one_call.logits(2, inputs[:, 0])
            row = {"size": size, "batch": batch, "codebook1_chain_us": timed(chain), "pass_call_us": timed(one)}
            report["results"].append(row)
            print(json.dumps(row), flush=True)
            json.dump(report, open(out_path, "w"), indent=1)
    del runner, model
    torch.cuda.empty_cache()
