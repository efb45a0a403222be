"""A request's decoding settings, as every layer from the API to the runner carries them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """How one codebook is drawn. temperature 0 means greedy (argmax)."""

    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class GenerationParams:
    """Per-request decoding settings; defaults are the reference generate()'s."""

    talker: SamplingParams = field(default_factory=SamplingParams)
    predictor: SamplingParams = field(default_factory=SamplingParams)
    repetition_penalty: float = 1.05
    max_new_frames: int = 2048
    min_new_frames: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise ValueError(f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}")
        if self.max_new_frames < 1:
            raise ValueError(f"max_new_frames must be >= 1, got {self.max_new_frames}")
        if self.min_new_frames < 0:
            raise ValueError(f"min_new_frames must be >= 0, got {self.min_new_frames}")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be in [0, 2**32), got {self.seed}")
