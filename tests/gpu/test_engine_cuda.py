"""On a GPU: the engine, graphs captured, gives the eager path's codes, and audio that decodes them (fp32, tiny
model)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from tests.engine.test_engine import eager_codes, mixed_requests
from tests.gpu.test_runner_cuda import refuse_host_syncs
from tts_service.engine.config import EngineConfig
from tts_service.engine.engine import Engine
from tts_service.engine.streams import SynthesisRequest, SynthesisSummary
from tts_service.model.checkpoint import LoadOptions
from tts_service.model.loading import load_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.usefixtures("fp32_convolutions")
@pytest.mark.parametrize(("chunk_schedule", "min_decodes_to_schedule_ahead"), [((1, 2, 4), None), ((1,), 0)],
                         ids=["growing-chunks-in-order", "one-frame-chunks-ahead"])
def test_the_engine_on_a_gpu_gives_the_eager_codes_and_their_audio(
        chunk_schedule: tuple[int, ...], min_decodes_to_schedule_ahead: int | None) -> None:
    model = load_model("random:tiny-custom_voice", LoadOptions(device=torch.device("cuda"), dtype=torch.float32))
    requests = mixed_requests(12)
    config = EngineConfig(max_running=8, block_size=16, num_kv_blocks=256, max_positions_per_request=512,
                          graph_batch_sizes=(1, 2, 4, 8), codec_chunk_schedule=chunk_schedule,
                          min_decodes_to_schedule_ahead=min_decodes_to_schedule_ahead)

    async def run() -> list[tuple[np.ndarray, object]]:
        engine = Engine.create(model, config)
        assert engine.runner.uses_graphs
        engine.start()
        streams = [await engine.submit(SynthesisRequest(f"r{index}", synthesis, params))
                   for index, (synthesis, params) in enumerate(requests)]
        results = [await stream.collect() for stream in streams]
        await engine.stop()
        assert (engine.stats.num_steps_ahead > 0) == (min_decodes_to_schedule_ahead is not None)
        return results

    results = asyncio.run(run())
    for (waveform, summary), want in zip(results, eager_codes(model, requests), strict=True):
        assert torch.equal(torch.from_numpy(summary.codes), want.cpu())
        with torch.inference_mode():
            codes = torch.from_numpy(summary.codes).to("cuda").T[None]
            one_shot = model.codec_decoder(codes)[0, 0].float().cpu().numpy() if len(summary.codes) else np.zeros(0)
        # Chunked and whole in exact fp32 agree to ~1e-6; a wrong codec state would be off by far more.
        assert waveform.shape == one_shot.shape
        assert np.abs(waveform - one_shot).max() < 1e-4


@pytest.mark.parametrize("min_decodes_to_schedule_ahead", [None, 0], ids=["in-order", "ahead"])
def test_the_engine_queues_every_step_without_waiting_for_the_device(monkeypatch: pytest.MonkeyPatch,
                                                                     min_decodes_to_schedule_ahead: int | None) -> None:
    """Mixed requests (greedy and sampled, streamed and whole text) with the default one-frame chunks, as the
    server runs them: the runner's queueing calls run under torch's sync debug mode set to raise, so a blocking
    call fails its step's requests with the error. Ahead, a step is queued while the one before still runs."""
    model = load_model("random:tiny-custom_voice", LoadOptions(device=torch.device("cuda"), dtype=torch.float32))
    requests = mixed_requests(12)
    config = EngineConfig(max_running=8, block_size=16, num_kv_blocks=256, max_positions_per_request=512,
                          graph_batch_sizes=(1, 2, 4), min_decodes_to_schedule_ahead=min_decodes_to_schedule_ahead)

    async def run() -> list[SynthesisSummary]:
        engine = Engine.create(model, config)
        refuse_host_syncs(engine.runner, monkeypatch)
        engine.start()
        streams = [await engine.submit(SynthesisRequest(f"r{index}", synthesis, params))
                   for index, (synthesis, params) in enumerate(requests)]
        results = await asyncio.wait_for(asyncio.gather(*(stream.collect() for stream in streams)), 120)
        await engine.stop()
        assert (engine.stats.num_steps_ahead > 0) == (min_decodes_to_schedule_ahead is not None)
        return [summary for _, summary in results]

    summaries = asyncio.run(run())
    assert all(summary.error is None and summary.num_frames > 0 for summary in summaries)
