"""Prompt layouts -> talker input embeddings.

Which positions hold a codec token, the speaker's x-vector or a reference frame is worked out on the host
(`prompt_ids`), and every id a prompt needs goes to the device in one copy: the runner stages a whole step's
prompts in one pinned buffer, so building a step's embeddings never waits for the device and can overlap the
codec call queued ahead of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tts_service.model.prompts import REFERENCE_FRAME, SPEAKER_SLOT, Prompt
from tts_service.model.talker import Talker


@dataclass(frozen=True)
class PromptIds:
    """A prompt's ids on the host, in the order `embed_prompt_ids` reads them back from the device: text ids,
    codec tokens, their rows, the speaker's rows, the reference frames' rows, reference codes, then the frames
    and text ids a resumed request re-reads after its prompt."""

    parts: tuple[np.ndarray, ...]
    num_speaker_rows: int
    num_reference_frames: int
    num_resumed_frames: int

    @property
    def sizes(self) -> list[int]:
        return [len(part) for part in self.parts]

    def concatenated(self) -> np.ndarray:
        return np.concatenate(self.parts)

    def resumed_codebook0(self, uploaded: torch.Tensor) -> torch.Tensor | None:
        """Codebook 0 of the resumed frames, from `concatenated()` on the device; None when there are none."""
        if not self.num_resumed_frames:
            return None
        return uploaded.split(self.sizes)[6].view(self.num_resumed_frames, -1)[:, 0]


def prompt_ids(prompt: Prompt, has_speaker_embedding: bool, resumed_frames: tuple[tuple[int, ...], ...] = (),
               resumed_text_ids: tuple[int, ...] = ()) -> PromptIds:
    """The prompt's layout, checked: ValueError when it cannot be embedded."""
    codec_ids = np.asarray(prompt.codec_ids, dtype=np.int64)
    is_speaker, is_frame, is_token = codec_ids == SPEAKER_SLOT, codec_ids == REFERENCE_FRAME, codec_ids >= 0
    num_speaker_rows = int(np.count_nonzero(is_speaker))
    if num_speaker_rows and not has_speaker_embedding:
        raise ValueError("the prompt has a speaker slot but no speaker embedding was given")
    num_frames = len(prompt.reference_codes)
    if num_frames and np.count_nonzero(is_frame) != num_frames:
        raise ValueError(f"the prompt has {np.count_nonzero(is_frame)} reference-frame positions for "
                         f"{num_frames} reference frames")
    if len(resumed_frames) != len(resumed_text_ids):
        raise ValueError(f"{len(resumed_frames)} resumed frames with {len(resumed_text_ids)} text ids")
    parts = (np.asarray(prompt.text_ids, dtype=np.int64), codec_ids[is_token], np.flatnonzero(is_token),
             np.flatnonzero(is_speaker), np.flatnonzero(is_frame) if num_frames else np.zeros(0, np.int64),
             np.asarray(prompt.reference_codes, dtype=np.int64).reshape(-1),
             np.asarray(resumed_frames, dtype=np.int64).reshape(-1), np.asarray(resumed_text_ids, dtype=np.int64))
    return PromptIds(parts, num_speaker_rows, num_frames, len(resumed_frames))


def embed_prompt_ids(talker: Talker, ids: PromptIds, uploaded: torch.Tensor,
                     speaker_embedding: torch.Tensor | None) -> torch.Tensor:
    """[T + resumed frames, hidden] from `ids.concatenated()` on the device: each prompt position's text part
    plus its codec part (token, x-vector or reference frame), then each resumed frame plus its text token."""
    text_ids, tokens, token_rows, speaker_rows, frame_rows, codes, resumed, resumed_text = uploaded.split(ids.sizes)
    text = talker.embed_text(text_ids)
    codec = torch.zeros_like(text)
    codec.index_copy_(0, token_rows, talker.embed_codec(tokens))
    if ids.num_speaker_rows:
        assert speaker_embedding is not None
        vector = speaker_embedding.to(device=text.device, dtype=text.dtype, non_blocking=True)
        codec.index_copy_(0, speaker_rows, vector.expand(ids.num_speaker_rows, -1))
    if ids.num_reference_frames:
        codec.index_copy_(0, frame_rows, talker.embed_frame(codes.view(ids.num_reference_frames, -1)))
    embeds = text + codec
    if not ids.num_resumed_frames:
        return embeds
    frames = talker.embed_frame(resumed.view(ids.num_resumed_frames, -1)) + talker.embed_text(resumed_text)
    return torch.cat([embeds, frames])


def embed_prompt(talker: Talker, prompt: Prompt, speaker_embedding: torch.Tensor | None) -> torch.Tensor:
    """[T, hidden] for one prompt, uploaded on its own."""
    ids = prompt_ids(prompt, speaker_embedding is not None)
    device = talker.codec_head.weight.device
    return embed_prompt_ids(talker, ids, upload_ids(ids.concatenated(), device), speaker_embedding)


def embed_text_ids(talker: Talker, text_ids: list[int] | tuple[int, ...]) -> torch.Tensor:
    device = talker.codec_head.weight.device
    return talker.embed_text(upload_ids(np.asarray(text_ids, dtype=np.int64), device))


def upload_ids(values: np.ndarray, device: torch.device) -> torch.Tensor:
    """int64 ids on `device`, copied (the eager path's and start-up's uploads; the runner stages a step's)."""
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64)).to(device, copy=True)
