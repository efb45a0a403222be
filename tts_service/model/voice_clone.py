"""Reference audio -> a cloned voice: the speaker embedding, and for in-context cloning the codec's codes."""

from __future__ import annotations

import numpy as np
import torch

from tts_service.model.checkpoint import LoadedModel
from tts_service.model.prompts import PromptError, VoiceClone


@torch.inference_mode()
def clone_voice(model: LoadedModel, wav_24k: np.ndarray, reference_text: str | None,
                x_vector_only: bool) -> VoiceClone:
    """Speaker embedding (and, unless `x_vector_only`, reference codes) from 24 kHz mono audio."""
    if model.speaker_encoder is None:
        raise PromptError("voice.reference_audio", f"the loaded {model.config.model_type} model "
                                                   "cannot clone voices; voice cloning needs a Base checkpoint")
    audio = torch.from_numpy(np.ascontiguousarray(wav_24k, dtype=np.float32))
    embedding = model.speaker_encoder.embed(audio)
    codes = None
    if not x_vector_only:
        if model.codec_encoder is None:
            raise PromptError("voice.reference_audio", "this server was started without the codec encoder, "
                                                       "so only x-vector cloning is available")
        frames = model.codec_encoder.encode(audio)
        codes = tuple(tuple(int(c) for c in frame) for frame in frames.tolist())
    return VoiceClone(speaker_embedding=embedding, reference_codes=codes, reference_text=reference_text)
