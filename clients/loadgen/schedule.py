"""What the generator sends, and when: texts, their audio lengths, and the Poisson arrival times."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import cache
from importlib import resources

# Each request caps its audio at its text's natural length, so a random-weight model (which never
# stops on its own) generates what a real voice would. Mandarin is spoken at about 4 to 5 characters
# a second, English at about 15 letters and spaces.
CHARACTERS_PER_SECOND = {"english": 15.0, "chinese": 4.5}
RPC_KINDS = ("online", "streaming")


@dataclass(frozen=True)
class Text:
    text: str
    language: str  # the VoiceSelection language the text is spoken in


@cache
def texts() -> tuple[Text, ...]:
    """The shipped workload (texts.jsonl): 540 varied sentences, 18% Chinese; English 3 to 40 words, Chinese 3 to 60
    characters."""
    lines = resources.files("clients.loadgen").joinpath("texts.jsonl").read_text(encoding="utf-8").splitlines()
    return tuple(Text(**json.loads(line)) for line in lines if line.strip())


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    start_s: float  # after the run's start
    rpc: str  # "online" (SynthesizeOnline) or "streaming" (StreamingSynthesize)
    text: str
    language: str
    max_audio_seconds: float


def audio_seconds_for(text: Text) -> float:
    return max(0.16, len(text.text) / CHARACTERS_PER_SECOND[text.language])


def poisson_schedule(rate_per_s: float, duration_s: float, rpc: str, seed: int,
                     max_audio_seconds: float | None = None, language: str | None = None) -> list[PlannedRequest]:
    """Exponential gaps at `rate_per_s` until `duration_s`; `rpc` "mixed" picks each call at random.

    Each request's text is drawn from `texts()` (only those in `language`, if given) by the same seeded
    generator as the arrivals, so a seed fixes the whole workload. Each request asks for its text's
    natural audio length, capped at `max_audio_seconds` if given.
    """
    if rate_per_s <= 0 or duration_s <= 0:
        raise ValueError("rate and duration must be > 0")
    if rpc not in (*RPC_KINDS, "mixed"):
        raise ValueError(f"rpc must be one of {(*RPC_KINDS, 'mixed')}, got {rpc!r}")
    candidates = [text for text in texts() if language is None or text.language == language]
    if not candidates:
        raise ValueError(f"no texts in language {language!r}; have {sorted({t.language for t in texts()})}")
    generator = random.Random(seed)
    planned: list[PlannedRequest] = []
    start_s = generator.expovariate(rate_per_s)
    while start_s < duration_s:
        text = candidates[generator.randrange(len(candidates))]
        kind = generator.choice(RPC_KINDS) if rpc == "mixed" else rpc
        audio_s = audio_seconds_for(text) if max_audio_seconds is None else min(max_audio_seconds,
                                                                                audio_seconds_for(text))
        planned.append(PlannedRequest(len(planned), start_s, kind, text.text, text.language, audio_s))
        start_s += generator.expovariate(rate_per_s)
    return planned


def text_fragments(text: str) -> list[str]:
    """Word-sized pieces that end inside words as often as between them, as LLM tokens do."""
    pieces, start = [], 0
    while start < len(text):
        end = min(len(text), start + 4)
        pieces.append(text[start:end])
        start = end
    return pieces
