"""The aligner as the engine runs it (`runner/aligner_runner.py`): clips packed one after another in fixed shapes
give each clip the numbers it gets aligned alone, whatever its length (shorter than a chunk, a short last chunk,
whole chunks) and whatever shares its batch; batches beyond the largest bucket are cut, and one clip beyond it
runs eagerly. On the CPU, without graphs: the math. tests/gpu/test_aligner_runner_cuda.py replays the graphs."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from tts_service.model import aligner_model
from tts_service.model.aligner import AlignmentItem, ForcedAligner, WordTiming
from tts_service.runner import aligner_runner
from tts_service.runner.aligner_runner import AlignerRunner, Bucket, batches_that_fit, pack, smallest_bucket

RATE = 24000
# Lengths that take every path through the chunking: less than a chunk, a short last chunk, a one-frame last chunk,
# whole chunks, and a clip long enough to set the padding of everything beside it.
CLIPS = [(0.2, "x"), (0.6, "one two"), (1.5, "今天天气很好"), (2.0, "Hello there, my friend."),
         (3.37, "a b c d e f g h i j"), (1.0, "Ten.")]


def clip(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * 170 * t * (1 + t)) + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)


@pytest.fixture(scope="module")
def aligner() -> ForcedAligner:
    return ForcedAligner.load("random:tiny", "cpu", torch.float32)


@pytest.fixture(scope="module")
def items() -> list[AlignmentItem]:
    return [AlignmentItem(clip(seconds, seed), RATE, text) for seed, (seconds, text) in enumerate(CLIPS)]


@torch.inference_mode()
def test_packed_clips_get_the_logits_each_gets_aligned_alone(aligner: ForcedAligner,
                                                             items: list[AlignmentItem]) -> None:
    clips = aligner.clip_features(items, is_each_alone=True)
    batch = pack(clips, range(len(items)), aligner.tokens.audio_pad)
    logits = aligner.model.thinker.packed_logits(batch.on(aligner.device, aligner.dtype))
    for row, item in enumerate(items):
        alone = aligner.logits(aligner.prepare([item]))[0]
        start = batch.prompt_starts[row]
        packed = logits[start:start + len(clips.prompts[row])]
        torch.testing.assert_close(packed, alone, rtol=0, atol=1e-4)
        assert torch.equal(packed.argmax(-1), alone.argmax(-1))


@torch.inference_mode()
def test_a_clips_logits_do_not_depend_on_what_shares_its_batch(aligner: ForcedAligner,
                                                               items: list[AlignmentItem]) -> None:
    def logits_of_first(batch_items: list[AlignmentItem]) -> torch.Tensor:
        clips = aligner.clip_features(batch_items, is_each_alone=True)
        batch = pack(clips, range(len(batch_items)), aligner.tokens.audio_pad)
        return aligner.model.thinker.packed_logits(batch.on(aligner.device, aligner.dtype))[:len(clips.prompts[0])]

    torch.testing.assert_close(logits_of_first(items[1:2]), logits_of_first([items[1], items[4], items[0]]),
                               rtol=0, atol=1e-4)


def test_the_runner_times_every_clip_as_the_aligner_does_alone(aligner: ForcedAligner,
                                                                items: list[AlignmentItem]) -> None:
    runner = AlignerRunner(aligner, use_graphs=False)
    wordless = AlignmentItem(clip(0.5, 9), RATE, "...")
    results = runner.align_many([*items, wordless])
    assert results[-1] == []
    for item, timings in zip(items, results, strict=False):
        assert timings == aligner.align(item.audio, item.sample_rate, item.text)


@pytest.fixture
def small_buckets(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Bucket, ...]]:
    buckets = (Bucket(2, 60), Bucket(4, 120))
    monkeypatch.setattr(aligner_runner, "BUCKETS", buckets)
    yield buckets


def test_a_batch_beyond_the_largest_bucket_is_cut_and_a_clip_beyond_it_runs_alone_and_eagerly(
        aligner: ForcedAligner, items: list[AlignmentItem], small_buckets: tuple[Bucket, ...],
        monkeypatch: pytest.MonkeyPatch) -> None:
    long_clip = AlignmentItem(clip(4.5, 11), RATE, "a clip longer than every bucket")  # five chunks
    batch = [items[0], items[3], items[2], long_clip, items[1]]
    clips = aligner.clip_features(batch, is_each_alone=True)
    runs = list(batches_that_fit(clips, range(len(batch))))
    assert runs == [[0, 1], [2], [3], [4]]  # chunks: 1 + 3 fit in four, 2 + 5 do not, and 5 fit nowhere
    assert smallest_bucket(5, 10) is None and smallest_bucket(3, 10) == small_buckets[1]
    runner = AlignerRunner(aligner, use_graphs=False)
    eager_calls: list[int] = []
    original = aligner.align_many

    def counted(chosen: list[AlignmentItem]) -> list[list[WordTiming]]:
        eager_calls.append(len(chosen))
        return original(chosen)

    monkeypatch.setattr(aligner, "align_many", counted)
    results = runner.align_many(batch)
    assert eager_calls == [1]
    for item, timings in zip(batch, results, strict=True):
        assert timings == original([item])[0]


@pytest.mark.parametrize("is_causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_segment_bias_attends_exactly_as_the_boolean_mask_it_stands_for(is_causal: bool,
                                                                            dtype: torch.dtype) -> None:
    """Packed attention takes an additive bias made once a batch; SDPA makes the same one of a boolean mask at
    every call (zeros, -inf where the mask is false). Its rows sit in a buffer aligned for the memory-efficient
    kernel, which would otherwise copy them at every call."""
    segment = torch.tensor([0, 0, 0, 1, 1, -1, 2, 2, 2, 2, -1, -1, 1])
    bias = aligner_model.segment_bias(segment, is_causal=is_causal, dtype=dtype)
    index = torch.arange(segment.shape[0])
    allowed = (segment[:, None] == segment[None, :]) & (segment[None, :] >= 0)
    if is_causal:
        allowed &= index[None, :] <= index[:, None]
    allowed |= index[:, None] == index[None, :]
    assert bias.shape == (1, 1, 13, 13) and bias.dtype == dtype
    assert torch.equal(bias[0, 0] == 0, allowed) and bool(torch.isneginf(bias[0, 0][~allowed]).all())
    assert all(stride % 16 == 0 for stride in bias.stride()[:-1]) and bias.stride(-1) == 1
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(1, 4, 13, 32, generator=generator).to(dtype) for _ in range(3))
    with_bias = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=bias)
    with_mask = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=allowed[None, None])
    assert torch.equal(with_bias, with_mask)
