"""Whole-utterance synthesis on the eager path, and the `qwen3-tts-synthesize` command.

This is the simplest complete route from text to a waveform: build the prompt, generate codes
with the eager generate path, decode them with the codec decoder in one shot.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tts_service.audio_input import ReferenceAudioError, decode_audio_file
from tts_service.generate import GeneratedCodes, GenerationParams, GenerationRequest, generate_codes
from tts_service.model.checkpoint import CheckpointError, LoadedModel, LoadOptions, load_model
from tts_service.prompts import PromptBuilder, PromptError, SynthesisInput, VoiceClone
from tts_service.sampling import SamplingParams

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"
OFFLINE_FALLBACK_MODEL = "random:tiny-custom_voice"


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

    @torch.inference_mode()
    def clone_voice(self, wav_24k: np.ndarray, reference_text: str | None, x_vector_only: bool) -> VoiceClone:
        """Speaker embedding (and, for in-context cloning, reference codes) from 24 kHz mono audio."""
        if self.model.speaker_encoder is None:
            raise PromptError("voice.reference_audio", f"the loaded {self.model.config.model_type} model "
                                                       "cannot clone voices; voice cloning needs a Base checkpoint")
        audio = torch.from_numpy(np.ascontiguousarray(wav_24k, dtype=np.float32))
        embedding = self.model.speaker_encoder.embed(audio)
        codes = None
        if not x_vector_only:
            if self.model.codec_encoder is None:
                raise PromptError("voice.reference_audio", "this server was started without the codec encoder, "
                                                           "so only x-vector cloning is available")
            frames = self.model.codec_encoder.encode(audio)
            codes = tuple(tuple(int(c) for c in frame) for frame in frames.tolist())
        return VoiceClone(speaker_embedding=embedding, reference_codes=codes, reference_text=reference_text)

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


def load_with_offline_fallback(source: str, options: LoadOptions) -> LoadedModel:
    try:
        return load_model(source, options)
    except CheckpointError as error:
        if source != DEFAULT_MODEL:
            raise
        logger.warning("%s", error)
        logger.warning("falling back to %s: a tiny model with RANDOM weights. It runs the whole pipeline, "
                       "but its audio is noise, not speech.", OFFLINE_FALLBACK_MODEL)
        return load_model(OFFLINE_FALLBACK_MODEL, options)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Synthesize speech with a Qwen3-TTS 12 Hz model into a WAV file.")
    parser.add_argument("text")
    parser.add_argument("-o", "--output", type=Path, default=Path("out.wav"))
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="checkpoint directory, Hugging Face repo id, or random:<size>-<type> "
                             f"(default {DEFAULT_MODEL}; offline it falls back to {OFFLINE_FALLBACK_MODEL})")
    parser.add_argument("--speaker", help="built-in speaker (CustomVoice models)")
    parser.add_argument("--language", default="auto")
    parser.add_argument("--instruction", help="voice or style description (VoiceDesign, 1.7B CustomVoice)")
    parser.add_argument("--reference-audio", type=Path, help="audio of the voice to clone (Base models)")
    parser.add_argument("--reference-text", help="transcript of the reference audio (in-context cloning)")
    parser.add_argument("--x-vector-only", action="store_true", help="clone from the speaker embedding alone")
    parser.add_argument("--non-streaming-text", action="store_true",
                        help="give the talker the whole text up front instead of one token per frame")
    parser.add_argument("--temperature", type=float, default=0.9, help="0 for greedy decoding")
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--repetition-penalty", type=float, default=1.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=60.0, help="cap on generated audio")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    options = LoadOptions.default_for(args.device)
    try:
        model = load_with_offline_fallback(args.model, options)
        synthesizer = EagerSynthesizer(model)
        clone = None
        if args.reference_audio is not None:
            wav = decode_audio_file(args.reference_audio.read_bytes())
            clone = synthesizer.clone_voice(wav, args.reference_text, args.x_vector_only)
        item = SynthesisInput(text=args.text, language=args.language, speaker=args.speaker,
                              instruction=args.instruction, clone=clone,
                              non_streaming_mode=args.non_streaming_text)
        sampling = SamplingParams(args.temperature, args.top_k, args.top_p)
        params = GenerationParams(talker=sampling, predictor=sampling, repetition_penalty=args.repetition_penalty,
                                  max_new_frames=max(1, round(args.max_seconds * model.speech_config.frame_rate_hz)),
                                  seed=args.seed)
        result = synthesizer.synthesize([item], [params])[0]
    except (CheckpointError, PromptError, ReferenceAudioError, ValueError, OSError) as error:
        logger.error("%s", error)
        return 2
    import soundfile

    soundfile.write(args.output, result.waveform, result.sample_rate, subtype="PCM_16")
    seconds = len(result.waveform) / result.sample_rate
    note = " (random weights: the audio is noise)" if model.is_random else ""
    sys.stdout.write(f"wrote {args.output}: {seconds:.2f} s of audio, {result.codes.shape[0]} frames, "
                     f"finish reason {result.finish_reason}{note}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
