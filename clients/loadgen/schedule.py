"""What the generator sends, and when: texts, their audio lengths, and the Poisson arrival times."""

from __future__ import annotations

import random
from dataclasses import dataclass

# Fixed texts of different lengths; each request caps its audio at the text's natural length, so a
# random-weight model (which never stops on its own) generates what a real voice would.
TEXTS = (
    "Hello, and welcome to the show.",
    "The weather today is mild, with a light breeze from the west and clear skies.",
    "Please hold while I transfer your call to the next available agent.",
    "Your order has shipped and should arrive within three to five business days.",
    "Thanks!",
    "In the beginning, the universe was created; this has made a lot of people very angry "
    "and been widely regarded as a bad move.",
    "Turn left at the next intersection, then continue straight for two kilometres.",
    "Is there anything else I can help you with today?",
)
CHARACTERS_PER_SECOND = 15.0
RPC_KINDS = ("online", "streaming")


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    start_s: float  # after the run's start
    rpc: str  # "online" (SynthesizeOnline) or "streaming" (StreamingSynthesize)
    text: str
    max_audio_seconds: float


def audio_seconds_for(text: str) -> float:
    return max(0.16, len(text) / CHARACTERS_PER_SECOND)


def poisson_schedule(rate_per_s: float, duration_s: float, rpc: str, seed: int,
                     max_audio_seconds: float | None = None) -> list[PlannedRequest]:
    """Exponential gaps at `rate_per_s` until `duration_s`; `rpc` "mixed" picks each call at random.

    Each request asks for its text's natural audio length, capped at `max_audio_seconds` if given.
    """
    if rate_per_s <= 0 or duration_s <= 0:
        raise ValueError("rate and duration must be > 0")
    if rpc not in (*RPC_KINDS, "mixed"):
        raise ValueError(f"rpc must be one of {(*RPC_KINDS, 'mixed')}, got {rpc!r}")
    generator = random.Random(seed)
    planned: list[PlannedRequest] = []
    start_s = generator.expovariate(rate_per_s)
    while start_s < duration_s:
        text = TEXTS[generator.randrange(len(TEXTS))]
        kind = generator.choice(RPC_KINDS) if rpc == "mixed" else rpc
        audio_s = audio_seconds_for(text) if max_audio_seconds is None else min(max_audio_seconds,
                                                                                audio_seconds_for(text))
        planned.append(PlannedRequest(len(planned), start_s, kind, text, audio_s))
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
