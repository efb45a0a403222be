"""The aligner's captured graphs on a GPU (random 0.6B weights at the published shapes): a replay gives the classes
the same packed pass gives eagerly, in every bucket a batch lands in; in float32 the packed pass gives each clip the
logits it gets aligned alone; and the engine's runner times words inside each clip."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tts_service.model.aligner import AlignmentItem, ForcedAligner
from tts_service.runner.aligner_runner import AlignerRunner, pack, smallest_bucket

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

RATE = 24000
TEXT = "the quick brown fox jumps over a lazy dog while seven bright birds sing"


def items(lengths_s: list[float], seed: int = 0) -> list[AlignmentItem]:
    rng = np.random.default_rng(seed)
    words = TEXT.split()
    return [AlignmentItem(rng.standard_normal(round(seconds * RATE)).astype(np.float32) * 0.1, RATE,
                          " ".join(words[:1 + round(seconds * 2.5) % len(words)]))
            for seconds in lengths_s]


@pytest.fixture(scope="module")
def runner() -> AlignerRunner:
    return AlignerRunner(ForcedAligner.load("random:0.6b", "cuda", torch.bfloat16))


@pytest.mark.parametrize("lengths_s", [[0.7], [1.0, 2.5, 0.3], [5.0] * 6, [12.0, 3.3, 7.9, 0.5] * 2])
@torch.inference_mode()
def test_a_replay_gives_the_classes_of_the_same_packed_pass_run_eagerly(runner: AlignerRunner,
                                                                       lengths_s: list[float]) -> None:
    aligner = runner.aligner
    clips = aligner.clip_features(items(lengths_s), is_each_alone=True)
    batch = pack(clips, range(len(lengths_s)), aligner.tokens.audio_pad)
    bucket = smallest_bucket(batch.num_chunks, batch.num_tokens)
    assert bucket in runner.captured_buckets
    with torch.cuda.stream(runner.stream):
        runner._static.load(batch, bucket)
        runner._graphs[bucket].replay()
        replayed = runner._read_classes(batch.num_tokens)
        eager = aligner.model.thinker.packed_classes(runner._static.view(bucket))[:batch.num_tokens].cpu().numpy()
    np.testing.assert_array_equal(replayed, eager)


@torch.inference_mode()
def test_in_float32_packed_clips_get_the_logits_each_gets_aligned_alone() -> None:
    was_tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        aligner = ForcedAligner.load("random:0.6b", "cuda", torch.float32)
        batch_items = items([0.6, 3.37, 1.5, 9.0])
        clips = aligner.clip_features(batch_items, is_each_alone=True)
        batch = pack(clips, range(len(batch_items)), aligner.tokens.audio_pad)
        logits = aligner.model.thinker.packed_logits(batch.on(aligner.device, aligner.dtype))
        for row, item in enumerate(batch_items):
            alone = aligner.logits(aligner.prepare([item]))[0]
            start = batch.prompt_starts[row]
            torch.testing.assert_close(logits[start:start + len(clips.prompts[row])], alone, rtol=0, atol=2e-3)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = was_tf32


def test_the_runner_times_every_word_inside_its_clip(runner: AlignerRunner) -> None:
    batch_items = items([2.0, 6.5, 0.4, 15.0])
    results = runner.align_many(batch_items)
    for item, timings in zip(batch_items, results, strict=True):
        duration_s = item.audio.shape[0] / RATE
        assert len(timings) == len(item.text.split())
        assert all(0.0 <= word.start_s <= word.end_s <= duration_s for word in timings)


@torch.inference_mode()
def test_the_fused_text_decoder_is_as_close_to_float32_as_the_eager_chain() -> None:
    """The engine's runner switches the aligner's text decoder to the fused kernels; in bf16 its logits at the
    timestamps stay as close to a float32 pass as the eager chain's, and pick the classes it picks but at near
    ties."""
    was_tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        eager = ForcedAligner.load("random:0.6b", "cuda", torch.bfloat16)
        fused = ForcedAligner.load("random:0.6b", "cuda", torch.bfloat16)
        exact = ForcedAligner.load("random:0.6b", "cuda", torch.float32)
        assert AlignerRunner(fused, use_graphs=False).is_fused
        assert not any(layer.mlp.is_fused for layer in eager.model.thinker.model.layers)
        batch_items = items([0.6, 3.37, 1.5, 9.0, 14.2], seed=3)
        clips = eager.clip_features(batch_items, is_each_alone=True)
        batch = pack(clips, range(len(batch_items)), eager.tokens.audio_pad)
        is_stamp = torch.from_numpy(batch.input_ids == eager.tokens.timestamp).cuda()

        def stamps(aligner: ForcedAligner) -> torch.Tensor:
            return aligner.model.thinker.packed_logits(batch.on(aligner.device, aligner.dtype))[is_stamp].float()

        truth, chain, one_pass = stamps(exact), stamps(eager), stamps(fused)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = was_tf32
    assert (one_pass - truth).abs().mean() <= 1.1 * (chain - truth).abs().mean()
    picks_chain = (chain.argmax(-1) == truth.argmax(-1)).float().mean()
    picks_fused = (one_pass.argmax(-1) == truth.argmax(-1)).float().mean()
    assert picks_fused >= picks_chain - 0.05


def test_on_a_gpu_the_frames_are_the_extractors_without_cufft(runner: AlignerRunner,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """cuFFT's kernel faulted under word-timestamp load (tts_service/model/log_mel.py): on a GPU no frame of the
    aligner goes through torch.stft, and the frames are the extractor's on the host to float32 rounding."""
    aligner = runner.aligner
    rng = np.random.default_rng(3)
    clips = [rng.standard_normal(length).astype(np.float32) * 0.1 for length in (16000, 201, 52805)]
    extracted = aligner.feature_extractor(clips, sampling_rate=16000, padding=True, truncation=False,
                                          return_attention_mask=True, return_tensors="pt", device="cpu")
    counts = extracted["attention_mask"].sum(-1).tolist()

    def no_stft(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch.stft ran on the GPU")

    monkeypatch.setattr(torch, "stft", no_stft)
    for row, frames in enumerate(aligner._log_mel(clips)):
        torch.testing.assert_close(frames, extracted["input_features"][row, :, :counts[row]], rtol=0.0, atol=1e-5)
