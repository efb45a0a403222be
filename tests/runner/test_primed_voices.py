"""The codec state after a clone's reference frames, kept per voice: a later stream in that voice starts from it,
with the values a fresh decode of the frames gives."""

from __future__ import annotations

import numpy as np
import torch

from tests.runner.test_runner import runner_config
from tts_service.runner.primed_voices import reference_key
from tts_service.runner.runner import AudioRestart, ModelRunner


def test_a_voice_is_named_by_its_frames_codes_and_shape_whatever_their_integer_type() -> None:
    frames = np.arange(32, dtype=np.int64).reshape(4, 8)
    assert reference_key(frames) == reference_key(frames.astype(np.int32))
    assert reference_key(frames) != reference_key(frames.reshape(8, 4))
    changed = frames.copy()
    changed[3, 7] += 1
    assert reference_key(frames) != reference_key(changed)


def codec_row(runner: ModelRunner, slot: int) -> list[torch.Tensor]:
    return runner.codec_state.select_rows(torch.tensor([slot])).tensors()


def test_a_second_stream_in_a_voice_starts_from_the_kept_state_with_a_fresh_decodes_values(tiny_models) -> None:
    model = tiny_models["base"]
    runner = ModelRunner(model, runner_config(model, num_kv_blocks=64, max_positions_per_request=256))
    fresh = ModelRunner(model, runner_config(model, num_kv_blocks=64, max_positions_per_request=256,
                                             max_primed_voices=0))
    reference = np.random.default_rng(5).integers(0, 2048, (7, runner.num_groups))
    decoded: list[tuple[list[int], np.ndarray]] = []
    real_prime = runner.prime_audio

    def counting_prime(slots: list[int], codes: np.ndarray) -> None:
        decoded.append((slots, codes))
        real_prime(slots, codes)

    runner.prime_audio = counting_prime  # type: ignore[method-assign]
    with torch.inference_mode():
        assert runner._restart_audio((AudioRestart(0, reference, is_voice_reference=True),)) == {}
        assert runner._restart_audio((AudioRestart(1, reference, is_voice_reference=True),)) == {}
        fresh._restart_audio((AudioRestart(0, reference, is_voice_reference=True),))
    assert len(decoded) == 1 and decoded[0][0] == [0]  # the second stream decoded nothing
    assert runner.primed_voices.num_hits == 1 and len(runner.primed_voices) == 1 and len(fresh.primed_voices) == 0
    for kept, started, decoded_fresh in zip(codec_row(runner, 0), codec_row(runner, 1), codec_row(fresh, 0),
                                            strict=True):
        assert torch.equal(started, kept) and torch.equal(started, decoded_fresh)
    frames = np.random.default_rng(6).integers(0, 2048, (1, 3, runner.num_groups))
    first, second = runner.decode_audio([0], frames), runner.decode_audio([1], frames)
    assert np.array_equal(first, second) and np.array_equal(second, fresh.decode_audio([0], frames))


def test_a_resumed_streams_context_is_decoded_and_not_kept(tiny_models) -> None:
    model = tiny_models["base"]
    runner = ModelRunner(model, runner_config(model, num_kv_blocks=64, max_positions_per_request=256))
    context = np.random.default_rng(5).integers(0, 2048, (7, runner.num_groups))
    with torch.inference_mode():
        runner._restart_audio((AudioRestart(0, context), AudioRestart(1, context)))
    assert len(runner.primed_voices) == 0 and runner.primed_voices.num_misses == 0
