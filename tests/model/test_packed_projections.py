"""Packed projections: one matrix in memory that the separate projections read through views, and never on
the CPU, whose eager chain is the reference the parity tests hold to."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tts_service.model.checkpoint import LoadOptions, load_model
from tts_service.model.layers import MLP, pack_weights, use_fused_kernels


def test_packed_weights_are_the_projections_memory_and_compute_their_outputs() -> None:
    torch.manual_seed(0)
    mlp = MLP(16, 24)
    x = torch.randn(3, 16)
    separate = torch.cat([mlp.gate_proj(x), mlp.up_proj(x)], dim=-1)
    keys = list(mlp.state_dict())
    packed = pack_weights(mlp.gate_proj, mlp.up_proj)
    assert packed.shape == (48, 16)
    assert mlp.gate_proj.weight.data_ptr() == packed.data_ptr()
    assert mlp.up_proj.weight.data_ptr() == packed[24:].data_ptr()
    torch.testing.assert_close(F.linear(x, packed), separate)
    with torch.no_grad():
        mlp.up_proj.weight.add_(1.0)  # a later load writes through the view into the packed matrix
    assert torch.equal(packed[24:], mlp.up_proj.weight)
    assert list(mlp.state_dict()) == keys  # the checkpoint's layout is unchanged


def test_fused_kernels_on_the_cpu_leave_the_projections_unpacked() -> None:
    talker = load_model("random:tiny-custom_voice", LoadOptions(device=torch.device("cpu"), dtype=torch.float32)).talker
    assert use_fused_kernels(talker, True) > 0
    layer = talker.model.layers[0]
    assert layer.self_attn.qkv_weight is None and layer.mlp.gate_up_weight is None
