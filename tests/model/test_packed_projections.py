"""Packed projections: one matrix in memory that the separate projections read through views, and never on
the CPU, whose eager chain is the reference the parity tests hold to."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tts_service.model.checkpoint import LoadOptions
from tts_service.model.layers import MLP, pack_weights, use_fused_kernels
from tts_service.model.loading import load_model


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
    assert talker.frame_table is None


def test_a_packed_frame_table_embeds_frames_as_the_sixteen_lookups_do_and_keeps_the_checkpoint_layout() -> None:
    options = LoadOptions(device=torch.device("cpu"), dtype=torch.bfloat16)
    talker = load_model("random:tiny-custom_voice", options).talker
    acoustic = [torch.randint(0, talker.config.code_predictor.vocab_size, (5, 3))
                for _ in range(talker.config.num_code_groups - 1)]
    codes = torch.stack([torch.randint(0, talker.config.layers.vocab_size, (5, 3)), *acoustic], dim=-1)
    separate = talker.embed_frame(codes)
    keys = list(talker.state_dict())
    talker.pack_projections()
    assert talker.frame_table is not None
    assert talker.model.codec_embedding.weight.data_ptr() == talker.frame_table.data_ptr()
    assert torch.equal(talker.embed_frame(codes), separate)
    assert torch.equal(talker.code_predictor.embed(3, codes[..., 3]),
                       talker.frame_table[int(talker.frame_offsets[3]) + codes[..., 3]])
    assert list(talker.state_dict()) == keys
