"""What the API may know about the loaded model, as one frozen record: the engine hands it out so that
the front doors never reach into the model itself."""

from __future__ import annotations

from dataclasses import dataclass

from tts_service.model.checkpoint import LoadedModel
from tts_service.model.kernel_policy import KernelPolicy
from tts_service.model.speech_length import estimated_speech_seconds
from tts_service.runner.params import GenerationParams, params_from_generation_config


@dataclass(frozen=True)
class ModelInfo:
    source: str  # what was loaded: a directory, a repo id, or random:<preset>
    model_type: str  # custom_voice, voice_design or base
    model_size: str  # as the checkpoint names it ("0b6", "1b7"); empty when it does not
    speaker_dialects: dict[str, str | None]  # built-in speakers -> their dialect, if any
    languages: tuple[str, ...]
    accepts_instruction: bool
    can_clone: bool  # has a speaker encoder (Base checkpoints)
    can_clone_in_context: bool  # also has the codec encoder, so reference audio can become codes
    is_random: bool  # random weights: the audio is noise
    frame_rate_hz: float
    samples_per_frame: int
    sample_rate: int  # of the model's audio
    dtype: str
    device: str
    # What a request that sets nothing gets, as qwen-tts gives it: the checkpoint's generation_config.json over
    # the reference's own defaults; the whole text up front except for Base (voice clone) models.
    default_params: GenerationParams
    default_non_streaming_text: bool
    # The runner's fused paths this run takes (`KernelPolicy.active_paths`, those on); empty on the eager path.
    kernel_paths: tuple[str, ...] = ()
    # The forced aligner loaded beside the model (what --aligner-model named); None: no word timestamps.
    aligner: str | None = None

    @classmethod
    def of(cls, model: LoadedModel, kernel_paths: dict[str, bool | str] | None = None,
           aligner: str | None = None) -> ModelInfo:
        config = model.config
        speech = model.speech_config
        return cls(
            source=model.source, model_type=config.model_type, model_size=config.model_size,
            speaker_dialects=dict(config.talker.speaker_dialects), languages=tuple(config.talker.languages),
            accepts_instruction=config.accepts_instruction, can_clone=model.speaker_encoder is not None,
            can_clone_in_context=model.codec_encoder is not None,
            is_random=model.is_random, frame_rate_hz=speech.frame_rate_hz,
            samples_per_frame=speech.samples_per_frame, sample_rate=speech.output_sample_rate,
            dtype=str(model.talker.codec_head.weight.dtype).removeprefix("torch."), device=str(model.device),
            default_params=params_from_generation_config(model.generation_config),
            default_non_streaming_text=config.model_type != "base",
            kernel_paths=KernelPolicy.paths_taken(kernel_paths or {}), aligner=aligner)

    @property
    def speakers(self) -> list[str]:
        return sorted(self.speaker_dialects)

    def default_audio_seconds(self, text: str | None, max_audio_s: float) -> float:
        """The audio a request that sets no length may make: the cap, except that random weights, which never end
        speech by themselves, make about as long as reading `text` aloud takes (None: text still arriving)."""
        if not self.is_random or not text:
            return max_audio_s
        return min(max_audio_s, estimated_speech_seconds(text))

    def audio_seconds(self, num_frames: int) -> float:
        return num_frames * self.samples_per_frame / self.sample_rate
