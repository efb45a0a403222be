"""The codec's stream state after a voice clone's reference frames, kept per voice.

An in-context clone's audio stream starts by decoding the clone's reference frames (about 10 s of audio, some 125
frames), whose audio nobody hears: that left context is what makes the generated audio continue the reference's
voice. Decoded eagerly (no graph covers that length), it is the largest piece of device work a request brings, and
every request in the same voice decodes the same frames into the same state. So the state those frames leave (the
attention's rings, the convolutions' histories, the position) is kept here, keyed by the frames, and a later
stream in that voice starts from a copy of it: the same values a fresh decode gives, since it is the state such a
decode left. The least recently used voice is dropped beyond `max_voices`.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from tts_service.model.codec_decoder import CodecStreamState


def reference_key(context: np.ndarray) -> bytes:
    """What names a voice's reference frames [T, G]: their shape and codes."""
    frames = np.ascontiguousarray(context, dtype=np.int64)
    return hashlib.blake2b(repr(frames.shape).encode() + frames.tobytes(), digest_size=16).digest()


class PrimedVoices:
    """States after each voice's reference frames (one row each, as `CodecStreamState.select_rows` copies it),
    least recently used first."""

    def __init__(self, max_voices: int) -> None:
        self.max_voices = max_voices
        self._states: OrderedDict[bytes, CodecStreamState] = OrderedDict()
        self.num_hits = 0
        self.num_misses = 0

    def __len__(self) -> int:
        return len(self._states)

    def get(self, key: bytes) -> CodecStreamState | None:
        state = self._states.get(key)
        if state is None:
            self.num_misses += 1
            return None
        self._states.move_to_end(key)
        self.num_hits += 1
        return state

    def put(self, key: bytes, state: CodecStreamState) -> None:
        if self.max_voices == 0:
            return
        self._states[key] = state
        self._states.move_to_end(key)
        while len(self._states) > self.max_voices:
            self._states.popitem(last=False)
