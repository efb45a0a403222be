"""Prompt layouts -> talker input embeddings."""

from __future__ import annotations

import torch

from tts_service.model.prompts import REFERENCE_FRAME, SPEAKER_SLOT, Prompt
from tts_service.model.talker import Talker


def embed_prompt(talker: Talker, prompt: Prompt, speaker_embedding: torch.Tensor | None) -> torch.Tensor:
    """[T, hidden]: each position's text part plus its codec part (token, x-vector or reference frame)."""
    device = talker.codec_head.weight.device
    text = talker.embed_text(torch.tensor(prompt.text_ids, dtype=torch.long, device=device))
    codec_ids = torch.tensor(prompt.codec_ids, dtype=torch.long, device=device)
    codec = torch.zeros_like(text)
    is_token = codec_ids >= 0
    codec[is_token] = talker.embed_codec(codec_ids[is_token])
    is_speaker = codec_ids == SPEAKER_SLOT
    if bool(is_speaker.any()):
        if speaker_embedding is None:
            raise ValueError("the prompt has a speaker slot but no speaker embedding was given")
        codec[is_speaker] = speaker_embedding.to(device=device, dtype=text.dtype)
    is_frame = codec_ids == REFERENCE_FRAME
    if prompt.reference_codes:
        frames = torch.tensor(prompt.reference_codes, dtype=torch.long, device=device)
        codec[is_frame] = talker.embed_frame(frames)
    return text + codec


def embed_text_ids(talker: Talker, text_ids: list[int] | tuple[int, ...]) -> torch.Tensor:
    device = talker.codec_head.weight.device
    return talker.embed_text(torch.tensor(text_ids, dtype=torch.long, device=device))
