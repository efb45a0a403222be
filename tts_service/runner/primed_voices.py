"""The codec's stream state after a voice clone's reference frames, kept per voice.

An in-context clone's audio stream starts by decoding the clone's reference frames (about 10 s of audio, some 125
frames), whose audio nobody hears: that left context is what makes the generated audio continue the reference's
voice. Decoded eagerly (no graph covers that length), it is the largest piece of device work a request brings, and
every request in the same voice decodes the same frames into the same state. So the state those frames leave (the
attention's rings, the convolutions' histories, the position) is kept here, keyed by the frames, and a later
stream in that voice starts from a copy of it: the same values a fresh decode gives, since it is the state such a
decode left. The least recently used voice is dropped beyond `--max-primed-voices`.
"""

from __future__ import annotations

import hashlib

import numpy as np

from tts_service.model.codec_decoder import CodecStreamState
from tts_service.model.recently_used import RecentlyUsed


def reference_key(context: np.ndarray) -> bytes:
    """What names a voice's reference frames [T, G]: their shape and codes."""
    frames = np.ascontiguousarray(context, dtype=np.int64)
    return hashlib.blake2b(repr(frames.shape).encode() + frames.tobytes(), digest_size=16).digest()


# States after each voice's reference frames (one row each, as `CodecStreamState.select_rows` copies it).
PrimedVoices = RecentlyUsed[bytes, CodecStreamState]
