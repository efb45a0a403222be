"""The one-kernel predictor call: its results on the CPU through Triton's interpreter (in a process of its own,
see `interpreted_predictor_pass`), and what it does to the predictor's modules."""

from __future__ import annotations

import pytest
import torch

from tests.runner.interpreted_predictor_pass import packed_talker
from tests.runner.triton_interpreter import run_interpreted
from tts_service.model.checkpoint import LoadOptions
from tts_service.model.kernel_policy import KernelPolicy
from tts_service.model.loading import load_model
from tts_service.runner import predictor_pass
from tts_service.runner.kv_cache import PagedKVCache
from tts_service.runner.predictor_pass import PredictorPass

pytest.importorskip("triton")

CPU = torch.device("cpu")


# One row holds two chunks of weights in flight a program, more rows one: each path against the chain. The frame's
# first call holds two tokens a stream: at one stream its two rows, at two its four (the head reads each stream's
# last); three streams' six are past the scratch.
@pytest.mark.parametrize("batch", [pytest.param(1, id="one-row-two-chunks-ahead-first-call-two-rows"),
                                   pytest.param(2, id="two-rows-first-call-four-rows"),
                                   pytest.param(3, id="three-rows-one-chunk-ahead")])
def test_one_call_gives_the_layer_chains_logits_and_stores_its_keys_and_values(batch: int) -> None:
    run_interpreted("tests.runner.interpreted_predictor_pass", "check_one_call_matches_the_layer_chain", batch)


def test_a_predictor_as_wide_as_the_talker_reads_its_input_in_the_first_layer() -> None:
    run_interpreted("tests.runner.interpreted_predictor_pass", "check_one_call_matches_the_layer_chain", 1, 1)


@torch.inference_mode()
def test_stacking_the_weights_leaves_the_modules_reading_the_same_values_in_place() -> None:
    talker = packed_talker()
    predictor = talker.code_predictor
    layer = predictor.model.layers[1]
    before = {name: tensor.clone() for name, tensor in predictor.state_dict().items()}
    one_call = PredictorPass(talker, torch.zeros(1), num_programs=1)
    after = predictor.state_dict()
    assert all(torch.equal(after[name], value) for name, value in before.items())
    v_rows = layer.self_attn.v_proj.out_features
    assert layer.self_attn.v_proj.weight.data_ptr() == one_call.qkv[1, -v_rows:].data_ptr()
    assert layer.self_attn.qkv_weight.data_ptr() == one_call.qkv[1].data_ptr()
    assert layer.mlp.down_proj.weight.data_ptr() == one_call.down[1].data_ptr()
    assert predictor.lm_head[4].weight.data_ptr() == one_call.heads[4].data_ptr()


@torch.inference_mode()
def test_the_call_is_launched_as_a_cooperative_grid_of_its_programs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its barriers need every program resident at once: the launch asks CUDA to promise it, or to refuse."""
    launches = []

    class RecordedLaunch:
        def __getitem__(self, grid: tuple[int]) -> object:
            return lambda *args, **options: launches.append((grid, options))

    monkeypatch.setattr(predictor_pass, "_predictor_pass_kernel", RecordedLaunch())
    talker = packed_talker()
    shape = talker.config.code_predictor
    paged = PagedKVCache(shape.num_hidden_layers, 1, talker.config.num_code_groups, shape.num_key_value_heads,
                         shape.head_dim, torch.float32, CPU)
    one_call = PredictorPass(talker, paged.storage, num_programs=3)
    one_call.logits(2, torch.zeros(1, 1, talker.config.layers.hidden_size))
    [(grid, options)] = launches
    assert grid == (3,) and options["launch_cooperative_grid"] is True


def test_the_kernel_covers_the_tiny_predictor_and_serves_only_half_precision_on_cuda() -> None:
    talker = load_model("random:tiny-custom_voice", LoadOptions(device=CPU, dtype=torch.float32)).talker
    assert PredictorPass.covers(talker)
    assert not KernelPolicy.build(CPU, torch.bfloat16).predictor_pass
    assert not KernelPolicy.build("cuda", torch.float32).predictor_pass
    assert KernelPolicy.build("cuda", torch.bfloat16).predictor_pass
