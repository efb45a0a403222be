"""Prompt layouts -> talker input embeddings.

Which positions hold a codec token, the speaker's x-vector or a reference frame is worked out on the host,
and the ids go to the device in one copy queued behind the device's work: building a prompt's embeddings
never waits for the device, so it can overlap the codec call queued ahead of it.
"""

from __future__ import annotations

import numpy as np
import torch

from tts_service.model.prompts import REFERENCE_FRAME, SPEAKER_SLOT, Prompt
from tts_service.model.talker import Talker


def embed_prompt(talker: Talker, prompt: Prompt, speaker_embedding: torch.Tensor | None) -> torch.Tensor:
    """[T, hidden]: each position's text part plus its codec part (token, x-vector or reference frame)."""
    device = talker.codec_head.weight.device
    codec_ids = np.asarray(prompt.codec_ids, dtype=np.int64)
    num_speaker_rows = int(np.count_nonzero(codec_ids == SPEAKER_SLOT))
    if num_speaker_rows and speaker_embedding is None:
        raise ValueError("the prompt has a speaker slot but no speaker embedding was given")
    num_frames = len(prompt.reference_codes)
    if num_frames and np.count_nonzero(codec_ids == REFERENCE_FRAME) != num_frames:
        raise ValueError(f"the prompt has {np.count_nonzero(codec_ids == REFERENCE_FRAME)} reference-frame "
                         f"positions for {num_frames} reference frames")
    host_parts = (np.asarray(prompt.text_ids, dtype=np.int64), codec_ids[codec_ids >= 0],
                  np.flatnonzero(codec_ids >= 0), np.flatnonzero(codec_ids == SPEAKER_SLOT),
                  np.flatnonzero(codec_ids == REFERENCE_FRAME) if num_frames else np.zeros(0, np.int64),
                  np.asarray(prompt.reference_codes, dtype=np.int64).reshape(-1))
    text_ids, tokens, token_rows, speaker_rows, frame_rows, codes = upload_ids(
        np.concatenate(host_parts), device).split([len(part) for part in host_parts])
    text = talker.embed_text(text_ids)
    codec = torch.zeros_like(text)
    codec.index_copy_(0, token_rows, talker.embed_codec(tokens))
    if num_speaker_rows:
        assert speaker_embedding is not None
        vector = speaker_embedding.to(device=device, dtype=text.dtype, non_blocking=True)
        codec.index_copy_(0, speaker_rows, vector.expand(num_speaker_rows, -1))
    if num_frames:
        codec.index_copy_(0, frame_rows, talker.embed_frame(codes.view(num_frames, -1)))
    return text + codec


def embed_text_ids(talker: Talker, text_ids: list[int] | tuple[int, ...]) -> torch.Tensor:
    device = talker.codec_head.weight.device
    return talker.embed_text(upload_ids(np.asarray(text_ids, dtype=np.int64), device))


def upload_ids(values: np.ndarray, device: torch.device) -> torch.Tensor:
    """int64 ids on `device`. On CUDA the copy goes through pinned memory, so it is queued behind the device's
    work rather than waiting for it."""
    host = torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
