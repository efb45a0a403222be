"""Word timestamps for speech and its transcript, from Qwen3-ForcedAligner-0.6B (`Qwen/Qwen3-ForcedAligner-0.6B`).

`ForcedAligner.load` takes a checkpoint directory in the published layout, a Hugging Face repo id, or `random:tiny`
/ `random:0.6b` (random weights: timings of noise, for tests and speed). `align` returns one `WordTiming` per word of
the caller's text, as character offsets into that text, with start and end in seconds.

The pipeline is the reference's (qwen-asr 0.0.6, `Qwen3ForcedAligner.align`), and proven equal to it on identical
weights (tests/model/test_aligner_parity.py):
  1. audio to mono float32 at 16 kHz (soxr, as librosa's default resampler), scaled down only if it peaks above 1;
  2. 128-bin log-mel frames (transformers' WhisperFeatureExtractor, 10 ms hop), the batch padded to its longest clip;
  3. the prompt `<|audio_start|>` + one `<|audio_pad|>` per audio token + `<|audio_end|>`, then each word followed
     by two `<timestamp>` tokens (its start and its end);
  4. one forward pass (`aligner_model`); the class predicted at each `<timestamp>` is a multiple of 80 ms;
  5. out-of-order times repaired (`aligner_text.repair_order`), truncated to whole milliseconds, rounded to 1 ms.
Beyond the reference, times are clamped to the audio's length by default (`clamp_to_audio`): a trained model
predicts inside the clip, random weights anywhere in the 400 s the classes span.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import soxr
import torch
import torch.nn.functional as F

from tts_service.model.aligner_config import ALIGNER_CONFIG_FILE, SAMPLE_RATE, AlignerConfig, audio_token_count
from tts_service.model.aligner_model import LoadedAligner, load_aligner_checkpoint
from tts_service.model.aligner_random import build_random_aligner
from tts_service.model.aligner_text import Word, split_words, word_times_s
from tts_service.model.checkpoint import CheckpointError, resolve_source
from tts_service.model.log_mel import MatrixLogMel
from tts_service.model.text_tokenizer import CONFIG_FILE, literal_text_encoder

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

AUDIO_START = "<|audio_start|>"
AUDIO_PAD = "<|audio_pad|>"
AUDIO_END = "<|audio_end|>"
TIMESTAMP = "<timestamp>"
# librosa.resample's default quality, which the reference resamples with.
_RESAMPLE_QUALITY = "soxr_hq"
# The reference's rule for a 2-D clip: [channels, samples] when it has at most this many rows and more columns.
_MAX_CHANNELS_FIRST = 8


@dataclass(frozen=True)
class WordTiming:
    """One word of the caller's text and when it is spoken."""

    start_char: int  # offset of the word's first character in the text given
    end_char: int  # one past its last character
    start_s: float
    end_s: float


@dataclass(frozen=True)
class AlignmentItem:
    """One clip and its transcript. `language` matters only for Japanese and Korean, which are refused (see
    `aligner_text`); any other language, or None, is cut into words the same way."""

    audio: np.ndarray  # [samples], [samples, channels], or [channels, samples] with at most 8 channels
    sample_rate: int
    text: str
    language: str | None = None


@dataclass(frozen=True)
class AlignerInputs:
    """A batch as the model reads it."""

    input_ids: torch.Tensor  # [B, T], left-padded
    attention_mask: torch.Tensor  # [B, T], 1 on real tokens
    features: list[torch.Tensor]  # each clip's log-mel frames [mel bins, frames]
    words: list[list[Word]]
    durations_s: list[float]  # each clip's length as given


@dataclass(frozen=True)
class ClipFeatures:
    """A batch on the host, before any layout: what `prepare` and the graph runner's packing both start from."""

    words: list[list[Word]]
    features: list[torch.Tensor]  # each clip's log-mel frames [mel bins, frames], float32 on the host
    frames: list[int]
    prompts: list[list[int]]  # each clip's prompt ids
    durations_s: list[float]  # each clip's length as given


@dataclass(frozen=True)
class PromptTokens:
    """The ids of the prompt's added tokens, as the tokenizer encodes them."""

    audio_start: int
    audio_pad: int
    audio_end: int
    timestamp: int
    padding: int

    @classmethod
    def of(cls, tokenizer: PreTrainedTokenizerFast, config: AlignerConfig) -> PromptTokens:
        added = tokenizer.get_added_vocab()
        absent = [token for token in (AUDIO_START, AUDIO_PAD, AUDIO_END, TIMESTAMP) if token not in added]
        if absent:
            raise CheckpointError(f"{CONFIG_FILE}: the text tokenizer has no added token {', '.join(absent)}")
        # The model finds the audio placeholders and reads the timestamps by the ids config.json gives.
        for token, key, expected in ((AUDIO_PAD, "thinker_config.audio_token_id", config.audio_token_id),
                                     (TIMESTAMP, "timestamp_token_id", config.timestamp_token_id)):
            if added[token] != expected:
                raise CheckpointError(f"{ALIGNER_CONFIG_FILE}: {key} is {expected}, but the text tokenizer encodes "
                                      f"{token} as {added[token]}")
        # Padding is never attended to; its id only has to exist.
        padding = tokenizer.pad_token_id
        return cls(added[AUDIO_START], added[AUDIO_PAD], added[AUDIO_END], added[TIMESTAMP],
                   padding if isinstance(padding, int) else 0)


class ForcedAligner:
    """Word timings for clips and their transcripts: one forward pass of the aligner per batch, eager."""

    def __init__(self, loaded: LoadedAligner) -> None:
        self.source = loaded.source
        self.config = loaded.config
        self.model = loaded.model
        self.feature_extractor = loaded.feature_extractor
        self.is_random = loaded.is_random
        self.tokens = PromptTokens.of(loaded.tokenizer, loaded.config)
        # Words hold only letters, digits and apostrophes, so they never spell an added token; encoded apart, each
        # gets the ids the reference's tokenizer gives it between the prompt's added tokens.
        self.encode_text = literal_text_encoder(loaded.tokenizer)
        # On a GPU the frames' transform is a matrix product, not cuFFT (log_mel's docstring says why); on the host
        # the extractor computes them, bitwise the reference's.
        is_product = self.device.type == "cuda" and self.feature_extractor.dither == 0.0
        self._matrix_log_mel = MatrixLogMel(self.feature_extractor, self.device) if is_product else None

    @classmethod
    def load(cls, source: str, device: str | torch.device, dtype: torch.dtype, cache_dir: str | None = None,
             max_download_wait_s: float = 0.0) -> ForcedAligner:
        """An aligner from a checkpoint directory, a Hugging Face repo id, or `random:<tiny|0.6b>`."""
        device = torch.device(device)
        if source.startswith("random:"):
            return cls(build_random_aligner(source.removeprefix("random:"), device, dtype))
        directory = resolve_source(source, cache_dir, max_download_wait_s)
        return cls(load_aligner_checkpoint(directory, device, dtype, source))

    @property
    def device(self) -> torch.device:
        return self.model.thinker.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.thinker.lm_head.weight.dtype

    def align(self, audio: np.ndarray, sample_rate: int, text: str, language: str | None = None,
              clamp_to_audio: bool = True) -> list[WordTiming]:
        """The words of `text` and when `audio` speaks them, in text order."""
        return self.align_many([AlignmentItem(audio, sample_rate, text, language)], clamp_to_audio)[0]

    def align_many(self, items: Sequence[AlignmentItem], clamp_to_audio: bool = True) -> list[list[WordTiming]]:
        """`align` for several clips in one forward pass (padded as the reference pads its batches, so each clip's
        timings are the reference's for the same batch). A text without words gets no timings and no model time."""
        words = [split_words(item.text, item.language) for item in items]
        results: list[list[WordTiming]] = [[] for _ in items]
        running = [index for index, item_words in enumerate(words) if item_words]
        if not running:
            return results
        inputs = self.prepare([items[index] for index in running], [words[index] for index in running])
        classes = self.logits(inputs).argmax(dim=-1).cpu()
        input_ids = inputs.input_ids.cpu()
        for row, index in enumerate(running):
            stamps = classes[row][input_ids[row] == self.tokens.timestamp].tolist()
            results[index] = self.timings(inputs.words[row], stamps, inputs.durations_s[row], clamp_to_audio)
        return results

    def timings(self, words: Sequence[Word], classes: Sequence[int], duration_s: float,
                clamp_to_audio: bool = True) -> list[WordTiming]:
        """Each word's times from the classes predicted at its two `<timestamp>`s, none later than the clip's end
        when `clamp_to_audio`."""
        limit_s = duration_s if clamp_to_audio else math.inf
        times = word_times_s(classes, self.config.timestamp_segment_ms)
        return [WordTiming(word.start_char, word.end_char, min(start, limit_s), min(end, limit_s))
                for word, (start, end) in zip(words, times, strict=True)]

    def prepare(self, items: Sequence[AlignmentItem], words: Sequence[list[Word]] | None = None) -> AlignerInputs:
        """The model's inputs for `items`, each of whose texts must hold a word (`words`: theirs, when already
        cut)."""
        clips = self.clip_features(items, words=words)
        features = [clip.to(self.device, self.dtype) for clip in clips.features]
        input_ids, attention_mask = self._left_padded(clips.prompts)
        return AlignerInputs(input_ids, attention_mask, features, clips.words, clips.durations_s)

    def clip_features(self, items: Sequence[AlignmentItem], is_each_alone: bool = False,
                      words: Sequence[list[Word]] | None = None) -> ClipFeatures:
        """Each item's words (`words`, when the caller has cut them), log-mel frames and prompt, on the host; each
        text must hold a word. The reference pads a batch's clips to the longest before its spectrogram, which
        changes a shorter clip's last frames; `is_each_alone` takes each clip's frames as it gets them alone."""
        words = list(words) if words is not None else [split_words(item.text, item.language) for item in items]
        if not items or not all(words):
            raise ValueError("every text to align needs at least one word (a letter or a digit)")
        # The extractor's framing reflects each clip's edges by half a window, which needs more samples than that.
        min_samples = self.feature_extractor.n_fft // 2 + 1
        clips = [prepare_audio(item.audio, item.sample_rate, min_samples) for item in items]
        # The spectrogram on the aligner's device: on a GPU it keeps the server's host threads (and the GIL) free.
        features = [clip for group in ([[clip] for clip in clips] if is_each_alone else [clips])
                    for clip in self._log_mel(group)]
        frames = [clip.shape[1] for clip in features]
        prompts = [self.prompt(item_words, audio_token_count(count))
                   for item_words, count in zip(words, frames, strict=True)]
        durations = [_mono(np.asarray(item.audio)).shape[0] / item.sample_rate for item in items]
        return ClipFeatures(words, features, frames, prompts, durations)

    def _log_mel(self, clips: list[np.ndarray]) -> list[torch.Tensor]:
        """Each clip's log-mel frames [mel bins, frames] (float32, on the host), the clips padded together."""
        if self._matrix_log_mel is not None:
            return self._matrix_log_mel(clips)
        extracted = self.feature_extractor(clips, sampling_rate=SAMPLE_RATE, padding=True, truncation=False,
                                           return_attention_mask=True, return_tensors="pt", device=str(self.device))
        frames = extracted["attention_mask"].sum(-1).tolist()
        return [extracted["input_features"][row, :, :count] for row, count in enumerate(frames)]

    def prompt(self, words: Sequence[Word], num_audio_tokens: int) -> list[int]:
        """`<|audio_start|>`, the audio placeholders, `<|audio_end|>`, then each word and its two `<timestamp>`s."""
        ids = [self.tokens.audio_start, *[self.tokens.audio_pad] * num_audio_tokens, self.tokens.audio_end]
        for word in words:
            ids += [*self.encode_text(word.text), self.tokens.timestamp, self.tokens.timestamp]
        return ids

    def _left_padded(self, prompts: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        length = max(len(prompt) for prompt in prompts)
        rows = [torch.tensor(prompt, dtype=torch.long) for prompt in prompts]
        input_ids = torch.stack([F.pad(row, (length - len(row), 0), value=self.tokens.padding) for row in rows])
        attention_mask = torch.stack([F.pad(torch.ones_like(row), (length - len(row), 0)) for row in rows])
        return input_ids.to(self.device), attention_mask.to(self.device)

    @torch.inference_mode()
    def logits(self, inputs: AlignerInputs) -> torch.Tensor:
        """Timestamp logits [B, T, classify_num] for every prompt position."""
        return self.model.thinker(inputs.input_ids, inputs.attention_mask, inputs.features)


def _mono(samples: np.ndarray) -> np.ndarray:
    if samples.ndim == 1:
        return samples
    if samples.ndim != 2:
        raise ValueError(f"audio must be [samples] or [samples, channels], got shape {samples.shape}")
    if samples.shape[0] <= _MAX_CHANNELS_FIRST and samples.shape[1] > samples.shape[0]:
        samples = samples.T
    return np.mean(samples, axis=-1).astype(np.float32)


def resample(samples: np.ndarray, sample_rate: int, target_rate: int) -> np.ndarray:
    """librosa.resample's default: soxr at high quality, the length fixed to ceil(n * ratio), in the input's dtype."""
    if sample_rate == target_rate:
        return samples
    length = int(np.ceil(samples.shape[-1] * (float(target_rate) / sample_rate)))
    out = soxr.resample(samples, sample_rate, target_rate, quality=_RESAMPLE_QUALITY)
    out = out[:length] if out.shape[0] >= length else np.pad(out, (0, length - out.shape[0]))
    return np.asarray(out, dtype=samples.dtype)


def prepare_audio(audio: np.ndarray, sample_rate: int, min_samples: int = 1) -> np.ndarray:
    """Any clip -> mono float32 at 16 kHz in [-1, 1], as the reference normalises an (array, rate) input; fewer than
    `min_samples` samples at 16 kHz is an error."""
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int | np.integer) or sample_rate <= 0:
        raise ValueError(f"sample_rate must be a positive integer, got {sample_rate!r}")
    samples = _mono(np.asarray(audio))
    if not np.issubdtype(samples.dtype, np.floating):
        samples = samples.astype(np.float32)
    if not np.isfinite(samples).all():
        raise ValueError("audio holds NaN or infinite samples")
    samples = resample(samples, int(sample_rate), SAMPLE_RATE).astype(np.float32)
    if samples.shape[0] < min_samples:
        raise ValueError(f"audio is too short to align: {samples.shape[0] / SAMPLE_RATE * 1000:.1f} ms, at least "
                         f"{min_samples / SAMPLE_RATE * 1000:.1f} ms are needed")
    peak = float(np.max(np.abs(samples)))
    if peak > 1.0:  # integer-scaled or clipped audio; the reference scales it down, never up
        samples = samples / peak
    return np.clip(samples, -1.0, 1.0)
