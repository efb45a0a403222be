"""Voices cloned from reference audio sent inline, kept per caller and recording.

A client that sends the same recording with every request (the way an API without registered voices is used)
would have it decoded, resampled and encoded by the speaker encoder and the codec's encoder on every call: tens of
milliseconds of a GPU each, and a place among the clones in progress (`--max-waiting-clones`). The clone is a pure
function of the recording and its fields, so it is kept here, keyed by the caller and a digest of them, and a
later request with the same recording speaks from the kept clone: the same voice, as the same encoding gives. The
least recently used is dropped beyond `--max-inline-clones`.
"""

from __future__ import annotations

import hashlib
from typing import Any

from tts_service.engine import VoiceClone
from tts_service.model.recently_used import RecentlyUsed


def inline_clone_key(caller: str, voice: Any) -> bytes:
    """What names a VoiceSelection's inline reference for `caller`: the recording and every field the clone reads."""
    digest = hashlib.blake2b(digest_size=20)
    for part in (caller.encode(), voice.reference_audio, str(voice.reference_audio_pcm16_rate).encode(),
                 voice.reference_text.encode(), b"x" if voice.x_vector_only else b"c"):
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.digest()


# Clones by `inline_clone_key`.
InlineClones = RecentlyUsed[bytes, VoiceClone]
