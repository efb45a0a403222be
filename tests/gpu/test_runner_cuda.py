"""On a GPU: the graph-captured runner produces the eager path's frames (fp32, tiny model)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.test_runner import BLOCK_SIZE, requests_for, run_staggered
from tts_service.generate import generate_codes
from tts_service.model.checkpoint import LoadOptions, load_model
from tts_service.runner import ModelRunner, RunnerConfig

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_graph_captured_runner_equals_eager_generate_on_gpu() -> None:
    model = load_model("random:tiny-custom_voice", LoadOptions(device=torch.device("cuda"), dtype=torch.float32))
    requests = requests_for(model, [9, 14, 11])
    expected = generate_codes(model.talker, requests, model.config.tts_pad_token_id)
    runner = ModelRunner(model, RunnerConfig(max_num_slots=4, block_size=BLOCK_SIZE, num_kv_blocks=64,
                                             max_positions_per_request=256, graph_batch_sizes=(1, 2)))
    assert runner.uses_graphs
    frames = run_staggered(runner, requests, [0, 3, 5], model.config.tts_pad_token_id)
    for got, want in zip(frames, expected, strict=True):
        assert torch.equal(torch.from_numpy(np.stack(got)), want.codes)


def test_graph_captured_codec_chunks_stream_the_one_shot_audio_on_gpu() -> None:
    model = load_model("random:tiny-custom_voice", LoadOptions(device=torch.device("cuda"), dtype=torch.float32))
    runner = ModelRunner(model, RunnerConfig(max_num_slots=4, block_size=BLOCK_SIZE, num_kv_blocks=8,
                                             max_positions_per_request=32, graph_batch_sizes=(1, 2),
                                             codec_graph_chunk_sizes=(1, 2, 4)))
    assert (2, 4) in runner.codec.graphs and (4, 4) in runner.codec.graphs
    generator = torch.Generator().manual_seed(5)
    codes = torch.randint(0, 2048, (3, 10, 16), generator=generator)
    slots = [3, 0, 2]
    runner.reset_audio(slots)
    # 1, 2 and 4 frames replay graphs (3 rows pad to the 4-row bucket); the 3-frame tail runs eagerly.
    pieces = [runner.decode_audio(slots, codes[:, start:end].numpy())
              for start, end in ((0, 1), (1, 3), (3, 7), (7, 10))]
    streamed = np.concatenate(pieces, axis=1)
    with torch.inference_mode():
        one_shot = model.codec_decoder(codes.cuda().transpose(1, 2))[:, 0].cpu().numpy()
    assert np.abs(streamed - one_shot).max() <= 1e-4
