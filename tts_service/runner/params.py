"""A request's decoding settings, as every layer from the API to the runner carries them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


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


def params_from_generation_config(raw: Mapping[str, Any]) -> GenerationParams:
    """A checkpoint's generation_config.json as request defaults; absent keys keep the reference's hard defaults.

    `do_sample: false` means greedy (temperature 0); the `subtalker_*` keys are the code predictor's. The frame
    limit stays the server's (its audio limit), not `max_new_tokens`. Raises ValueError naming a bad key."""
    defaults = GenerationParams()

    def number(key: str, fallback: float) -> float:
        found = raw.get(key)
        if found is None:
            return fallback
        if isinstance(found, bool) or not isinstance(found, (int, float)):
            raise ValueError(f"generation_config.json: {key} must be a number, got {type(found).__name__}")
        return found

    def flag(key: str) -> bool:
        found = raw.get(key, True)
        if not isinstance(found, bool):
            raise ValueError(f"generation_config.json: {key} must be true or false, got {type(found).__name__}")
        return found

    def sampling(sample_key: str, prefix: str, fallback: SamplingParams) -> SamplingParams:
        top_k = number(f"{prefix}top_k", fallback.top_k)
        if top_k != int(top_k):
            raise ValueError(f"generation_config.json: {prefix}top_k must be a whole number, got {top_k}")
        temperature = float(number(f"{prefix}temperature", fallback.temperature)) if flag(sample_key) else 0.0
        top_p = float(number(f"{prefix}top_p", fallback.top_p))
        try:
            return SamplingParams(temperature=temperature, top_k=int(top_k), top_p=top_p)
        except ValueError as error:  # its message starts with the parameter's name
            raise ValueError(f"generation_config.json: {prefix}{error}") from None

    talker = sampling("do_sample", "", defaults.talker)
    predictor = sampling("subtalker_dosample", "subtalker_", defaults.predictor)
    try:
        return GenerationParams(talker=talker, predictor=predictor,
                                repetition_penalty=float(number("repetition_penalty", defaults.repetition_penalty)))
    except ValueError as error:  # its message starts with the parameter's name
        raise ValueError(f"generation_config.json: {error}") from None
