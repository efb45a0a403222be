"""Voices cloned from reference audio sent inline, kept per caller and recording.

A client that sends the same recording with every request (the way an API without registered voices is used)
would have it decoded, resampled and encoded by the speaker encoder and the codec's encoder on every call: tens of
milliseconds of a GPU each, and a place among the clones in progress (`--max-waiting-clones`). The clone is a pure
function of the recording and its fields, so it is kept here, keyed by the caller and a digest of them, and a
later request with the same recording speaks from the kept clone: the same voice, as the same encoding gives. The
least recently used is dropped beyond `max_clones`.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

from tts_service.model.prompts import VoiceClone


def inline_clone_key(caller: str, voice: Any) -> bytes:
    """What names a VoiceSelection's inline reference for `caller`: the recording and every field the clone reads."""
    digest = hashlib.blake2b(digest_size=20)
    for part in (caller.encode(), voice.reference_audio, str(voice.reference_audio_pcm16_rate).encode(),
                 voice.reference_text.encode(), b"x" if voice.x_vector_only else b"c"):
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.digest()


class InlineClones:
    """Clones by `inline_clone_key`, least recently used first."""

    def __init__(self, max_clones: int) -> None:
        self.max_clones = max_clones
        self._clones: OrderedDict[bytes, VoiceClone] = OrderedDict()

    def __len__(self) -> int:
        return len(self._clones)

    def get(self, key: bytes) -> VoiceClone | None:
        clone = self._clones.get(key)
        if clone is not None:
            self._clones.move_to_end(key)
        return clone

    def put(self, key: bytes, clone: VoiceClone) -> None:
        if not self.max_clones:
            return
        self._clones[key] = clone
        self._clones.move_to_end(key)
        while len(self._clones) > self.max_clones:
            self._clones.popitem(last=False)
