"""On a GPU: the code predictor's paged memory (Triton store and attention) and its packed projections give the
codes that the copying memory and the separate projections give."""

from __future__ import annotations

import pytest
import torch

from tts_service.model.checkpoint import LoadOptions
from tts_service.model.kernel_policy import KernelPolicy
from tts_service.model.layers import use_fused_kernels
from tts_service.model.loading import load_model
from tts_service.model.triton_utils import HAS_TRITON
from tts_service.runner.frame_codes import predict_remaining_codebooks
from tts_service.runner.frame_step import PagedPredictorCache, PredictorCache, predictor_memory
from tts_service.runner.sampling import RowSampling

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and HAS_TRITON),
                                reason="needs a CUDA GPU and Triton")

DEVICE = torch.device("cuda")


def predictor_inputs(hidden_size: int, batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator(device=DEVICE).manual_seed(3)
    hidden = torch.randn(batch, hidden_size, generator=generator, device=DEVICE)
    code0 = torch.randint(0, 2048, (batch,), generator=generator, device=DEVICE)
    seeds = torch.randint(0, 2**62, (batch,), generator=generator, device=DEVICE)
    return hidden, code0, seeds


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_paged_predictor_memory_predicts_the_copying_memorys_codes(temperature: float) -> None:
    model = load_model("random:tiny-custom_voice", LoadOptions(device=DEVICE, dtype=torch.float32))
    talker = model.talker
    batch = 6
    hidden, code0, seeds = predictor_inputs(talker.config.layers.hidden_size, batch)
    rows = RowSampling(torch.full((batch,), temperature, device=DEVICE), torch.full((batch,), 50, device=DEVICE),
                       torch.full((batch,), 1.0, device=DEVICE))
    draws = torch.arange(batch, device=DEVICE) * 16
    paged = predictor_memory(talker, batch, KernelPolicy.build(DEVICE, torch.float32))
    assert isinstance(paged, PagedPredictorCache)
    codes = [predict_remaining_codebooks(talker, hidden, code0, rows, seeds, draws, memory)
             for memory in (PredictorCache(talker, batch, torch.float32, DEVICE), paged)]
    assert torch.equal(codes[0], codes[1])


def test_packed_projections_share_the_weights_and_predict_the_separate_projections_codes() -> None:
    model = load_model("random:tiny-custom_voice", LoadOptions(device=DEVICE, dtype=torch.float32))
    talker = model.talker
    batch = 4
    hidden, code0, seeds = predictor_inputs(talker.config.layers.hidden_size, batch)
    greedy = RowSampling(torch.zeros(batch, device=DEVICE), torch.zeros(batch, dtype=torch.int64, device=DEVICE),
                         torch.ones(batch, device=DEVICE))
    draws = torch.zeros(batch, dtype=torch.int64, device=DEVICE)

    def codes() -> torch.Tensor:
        memory = PredictorCache(talker, batch, torch.float32, DEVICE)
        return predict_remaining_codebooks(talker, hidden, code0, greedy, seeds, draws, memory)

    separate = codes()
    use_fused_kernels(talker, True)
    attention = talker.code_predictor.model.layers[0].self_attn
    assert attention.qkv_weight is not None
    assert attention.v_proj.weight.data_ptr() == attention.qkv_weight[-attention.v_proj.weight.shape[0]:].data_ptr()
    fused = codes()
    use_fused_kernels(talker, False)
    assert torch.equal(codes(), separate)  # the eager chain reads the packed memory through its views
    assert torch.equal(fused, separate)
