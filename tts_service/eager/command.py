"""`qwen3-tts-synthesize`: text -> a WAV file on the eager path, with no server.

A text longer than `--max-segment-chars` (a document: `--file chapter.txt`, or `-` for standard input) is spoken
segment by segment as the engine speaks it (eager/document.py), each segment written as it is made, with a progress
bar on a terminal. Offline (no Hub access) and asked for the default model, it falls back to a tiny random-weight
model and says so: the whole pipeline runs, but the audio is noise.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from tts_service.audio.reference import ReferenceAudioError, decode_audio_file
from tts_service.eager.document import synthesize_document
from tts_service.eager.synthesize import EagerSynthesizer
from tts_service.engine.config import EngineConfig
from tts_service.model.checkpoint import CheckpointError, LoadedModel, LoadOptions
from tts_service.model.loading import load_model
from tts_service.model.prompts import PromptError, SynthesisInput
from tts_service.model.segments import document_segments
from tts_service.model.sources import DEFAULT_MODEL, OFFLINE_FALLBACK_MODEL
from tts_service.model.speech_length import estimated_speech_seconds
from tts_service.runner.params import GenerationParams, SamplingParams, params_from_generation_config

logger = logging.getLogger(__name__)
DEFAULT_MAX_SECONDS = 60.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Synthesize speech with a Qwen3-TTS 12 Hz model into a WAV file.")
    parser.add_argument("text", nargs="?", help="the text to speak (or --file)")
    parser.add_argument("--file", help="read the text from this file, '-' for standard input: a text longer than "
                                       "--max-segment-chars is spoken segment by segment, in one voice")
    parser.add_argument("--max-segment-chars", type=int, default=EngineConfig.max_segment_chars,
                        help="longest run of whole sentences generated in one go (as the server's flag)")
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
    parser.add_argument("--non-streaming-text", action=argparse.BooleanOptionalAction,
                        help="give the talker the whole text up front instead of one token per frame (default, as "
                             "qwen-tts: on for CustomVoice and VoiceDesign models, off for Base models)")
    # Unset sampling settings take the checkpoint's generation_config.json, as qwen-tts does.
    parser.add_argument("--temperature", type=float, help="0 for greedy decoding")
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--repetition-penalty", type=float)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-seconds", type=float,
                        help=f"cap on each generation's audio: the text's, or each segment's of a long one (default "
                             f"{DEFAULT_MAX_SECONDS:g}, {EngineConfig.max_audio_s:g} for a segment; with random "
                             "weights, which never end speech by themselves, about as long as reading it takes)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return parser


def command_params(args: argparse.Namespace, defaults: GenerationParams, max_new_frames: int) -> GenerationParams:
    """The checkpoint's defaults with the flags given on top (a sampling flag sets the talker and the predictor)."""

    def sampling(default: SamplingParams) -> SamplingParams:
        return SamplingParams(
            temperature=default.temperature if args.temperature is None else args.temperature,
            top_k=default.top_k if args.top_k is None else args.top_k,
            top_p=default.top_p if args.top_p is None else args.top_p)

    return GenerationParams(talker=sampling(defaults.talker), predictor=sampling(defaults.predictor),
                            repetition_penalty=(defaults.repetition_penalty if args.repetition_penalty is None
                                                else args.repetition_penalty),
                            max_new_frames=max_new_frames, seed=args.seed)


def max_seconds(args: argparse.Namespace, text: str, is_segmented: bool, model: LoadedModel) -> float:
    """The cap on one generation (a segment of a long text is capped further by reading time or the guards)."""
    if args.max_seconds is not None:
        return args.max_seconds
    if is_segmented:
        return EngineConfig.max_audio_s
    if model.is_random:
        return min(DEFAULT_MAX_SECONDS, estimated_speech_seconds(text))
    return DEFAULT_MAX_SECONDS


def read_text(args: argparse.Namespace) -> str:
    """The text to speak, from the command line or `--file` (`-`: standard input)."""
    if (args.text is None) == (args.file is None):
        raise ValueError("give the text to speak, or --file, but not both")
    if args.file is None:
        return args.text
    text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
    if not text.strip():
        raise ValueError(f"--file {args.file}: the text is empty")
    return text


def load_with_offline_fallback(source: str, options: LoadOptions) -> LoadedModel:
    """`load_model`, except that the default model, when it cannot be had, is replaced by a tiny random one with a
    warning, so that a fresh machine with no Hub access still runs the whole pipeline. This quick-start command
    alone does this: a server loads exactly what it is asked for, or stops."""
    try:
        return load_model(source, options)
    except CheckpointError as error:
        if source != DEFAULT_MODEL:
            raise
        logger.warning("%s", error)
        logger.warning("falling back to %s: a tiny model with RANDOM weights. It runs the whole pipeline, "
                       "but its audio is noise, not speech.", OFFLINE_FALLBACK_MODEL)
        return load_model(OFFLINE_FALLBACK_MODEL, options)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    options = LoadOptions.default_for(args.device)
    import soundfile

    try:
        if args.max_segment_chars < 1:
            raise ValueError(f"--max-segment-chars must be >= 1, got {args.max_segment_chars}")
        text = read_text(args)
        segments = document_segments(text, args.max_segment_chars)
        model = load_with_offline_fallback(args.model, options)
        synthesizer = EagerSynthesizer(model)
        clone = None
        if args.reference_audio is not None:
            wav = decode_audio_file(args.reference_audio.read_bytes())
            clone = synthesizer.clone_voice(wav, args.reference_text, args.x_vector_only)
        non_streaming = (args.non_streaming_text if args.non_streaming_text is not None
                         else model.config.model_type != "base")
        item = SynthesisInput(text=text, language=args.language, speaker=args.speaker,
                              instruction=args.instruction, clone=clone, non_streaming_mode=non_streaming)
        cap_s = max_seconds(args, text, len(segments) > 1, model)
        params = command_params(args, params_from_generation_config(model.generation_config),
                                max(1, round(cap_s * model.speech_config.frame_rate_hz)))
        rate = model.speech_config.output_sample_rate
        # A bar only on a terminal, and only where there are segments to count.
        with soundfile.SoundFile(args.output, "w", rate, 1, subtype="PCM_16") as sink, \
                tqdm(total=len(text), unit="char", disable=None if len(segments) > 1 else True) as progress:
            result = synthesize_document(synthesizer, item, params, segments, sink.write,
                                         lambda segment, _: progress.update(segment.end - segment.start))
    except (CheckpointError, PromptError, ReferenceAudioError, ValueError, OSError) as error:
        logger.error("%s", error)
        return 2
    seconds = result.num_frames / model.speech_config.frame_rate_hz
    note = " (random weights: the audio is noise)" if model.is_random else ""
    pieces = f" in {result.num_segments} segments" if result.num_segments > 1 else ""
    retried = f", {len(result.retries)} made again ({', '.join(result.retries)})" if result.retries else ""
    sys.stdout.write(f"wrote {args.output}: {seconds:.2f} s of audio{pieces}, {result.num_frames} frames, "
                     f"finish reason {result.finish_reason}{retried}{note}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
