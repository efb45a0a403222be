"""Switching the decoder layers to the fused path keeps the checkpoint's parameters and the model's output."""

from __future__ import annotations

import torch

from tests.test_runner import requests_for
from tts_service.generate import generate_codes
from tts_service.model.checkpoint import LoadOptions, load_model
from tts_service.model.layers import Attention, use_fused_kernels


def test_merged_projections_are_views_that_keep_every_checkpoint_tensor() -> None:
    model = load_model("random:tiny-custom_voice", LoadOptions.default_for("cpu"))
    before = {name: tensor.clone() for name, tensor in model.talker.state_dict().items()}
    use_fused_kernels(model.talker, True)
    after = model.talker.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[name], before[name]) for name in before)
    attention = next(module for module in model.talker.modules() if isinstance(module, Attention))
    assert attention.qkv_weight is not None
    assert attention.k_proj.weight.untyped_storage().data_ptr() == attention.qkv_weight.untyped_storage().data_ptr()


def test_fused_path_on_the_cpu_gives_the_eager_codes() -> None:
    model = load_model("random:tiny-custom_voice", LoadOptions.default_for("cpu"))
    requests = requests_for(model, [9, 14, 11])
    eager = generate_codes(model.talker, requests, model.config.tts_pad_token_id)
    assert use_fused_kernels(model.talker, True) > 0
    fused = generate_codes(model.talker, requests, model.config.tts_pad_token_id)
    for got, want in zip(fused, eager, strict=True):
        assert torch.equal(got.codes, want.codes)
