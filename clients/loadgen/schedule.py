"""What the generator sends, and when: texts, their audio lengths, and the Poisson arrival times."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
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
                     max_audio_seconds: float | None = None, language: str | None = None,
                     max_text_chars: int | None = None) -> list[PlannedRequest]:
    """Exponential gaps at `rate_per_s` until `duration_s`; `rpc` "mixed" picks each call at random.

    Each request's text is drawn from `texts()` (only those in `language`, if given) by the same seeded
    generator as the arrivals, so a seed fixes the whole workload, and cut to `max_text_chars` if given.
    Each request asks for its text's natural audio length, capped at `max_audio_seconds` if given.
    """
    if rate_per_s <= 0 or duration_s <= 0:
        raise ValueError("rate and duration must be > 0")
    draw = _request_drawer(rpc, seed, max_audio_seconds, language, max_text_chars)
    generator = random.Random(seed)
    planned: list[PlannedRequest] = []
    start_s = generator.expovariate(rate_per_s)
    while start_s < duration_s:
        planned.append(draw(len(planned), start_s, generator))
        start_s += generator.expovariate(rate_per_s)
    return planned


def closed_loop_plan(num_requests: int, rpc: str, seed: int, max_audio_seconds: float | None = None,
                     language: str | None = None, max_text_chars: int | None = None) -> list[PlannedRequest]:
    """`num_requests` requests drawn as `poisson_schedule` draws them, with no arrival times (start_s 0): a closed
    loop sends each as soon as one of its slots is free."""
    if num_requests <= 0:
        raise ValueError("the number of requests must be > 0")
    draw = _request_drawer(rpc, seed, max_audio_seconds, language, max_text_chars)
    generator = random.Random(seed)
    return [draw(index, 0.0, generator) for index in range(num_requests)]


def _request_drawer(rpc: str, seed: int, max_audio_seconds: float | None, language: str | None,
                    max_text_chars: int | None) -> Callable[[int, float, random.Random], PlannedRequest]:
    if rpc not in (*RPC_KINDS, "mixed"):
        raise ValueError(f"rpc must be one of {(*RPC_KINDS, 'mixed')}, got {rpc!r}")
    candidates = [text for text in texts() if language is None or text.language == language]
    if not candidates:
        raise ValueError(f"no texts in language {language!r}; have {sorted({t.language for t in texts()})}")

    def draw(index: int, start_s: float, generator: random.Random) -> PlannedRequest:
        drawn = candidates[generator.randrange(len(candidates))]
        text = Text(drawn.text[:max_text_chars], drawn.language)
        kind = generator.choice(RPC_KINDS) if rpc == "mixed" else rpc
        audio_s = audio_seconds_for(text) if max_audio_seconds is None else min(max_audio_seconds,
                                                                                audio_seconds_for(text))
        return PlannedRequest(index, start_s, kind, text.text, text.language, audio_s)

    return draw


def text_fragments(text: str) -> list[str]:
    """Word-sized pieces that end inside words as often as between them, as LLM tokens do."""
    pieces, start = [], 0
    while start < len(text):
        end = min(len(text), start + 4)
        pieces.append(text[start:end])
        start = end
    return pieces
