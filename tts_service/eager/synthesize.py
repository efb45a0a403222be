"""Whole-utterance synthesis on the eager path (what the `qwen3-tts-synthesize` command runs).

This is the simplest complete route from text to a waveform: build the prompt, generate codes
with the eager generate path, decode them with the codec decoder in one shot.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tts_service.eager.generate import GeneratedCodes, GenerationRequest, generate_codes
from tts_service.model.checkpoint import LoadedModel
from tts_service.model.prompts import PromptBuilder, SynthesisInput, VoiceClone
from tts_service.model.voice_clone import clone_voice
from tts_service.runner.params import GenerationParams


@dataclass(frozen=True)
class SynthesisResult:
    waveform: np.ndarray  # float32 mono at `sample_rate`
    sample_rate: int
    codes: torch.Tensor  # [frames, codebooks]
    finish_reason: str


class EagerSynthesizer:
    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        self.prompts = PromptBuilder.for_tokenizer(model.config, model.tokenizer)

    def clone_voice(self, wav_24k: np.ndarray, reference_text: str | None, x_vector_only: bool) -> VoiceClone:
        return clone_voice(self.model, wav_24k, reference_text, x_vector_only)

    @torch.inference_mode()
    def synthesize(self, inputs: list[SynthesisInput], params: list[GenerationParams]) -> list[SynthesisResult]:
        requests = [
            GenerationRequest(self.prompts.build(item), param,
                              item.clone.speaker_embedding if item.clone is not None else None)  # type: ignore[arg-type]
            for item, param in zip(inputs, params, strict=True)
        ]
        generated = generate_codes(self.model.talker, requests, self.model.config.tts_pad_token_id)
        return [self._decode(item, codes) for item, codes in zip(inputs, generated, strict=True)]

    def _decode(self, item: SynthesisInput, generated: GeneratedCodes) -> SynthesisResult:
        """Decode with the reference codes (if any) as left context, and keep only the new audio."""
        decoder = self.model.codec_decoder
        device = self.model.device
        context = (torch.tensor(item.clone.reference_codes, dtype=torch.long)
                   if item.clone is not None and item.clone.reference_codes else
                   torch.zeros(0, generated.codes.shape[1], dtype=torch.long))
        codes = torch.cat([context, generated.codes]).to(device)
        samples_per_frame = self.model.speech_config.samples_per_frame
        if codes.shape[0] == 0:
            waveform = torch.zeros(0)
        else:
            waveform = decoder(codes.T[None]).reshape(-1)[context.shape[0] * samples_per_frame:]
        return SynthesisResult(waveform.float().cpu().numpy(), self.model.speech_config.output_sample_rate,
                               generated.codes, generated.finish_reason)
