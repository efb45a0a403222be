"""How long speech of a text takes, roughly.

A model with random weights never draws its end-of-speech token, so a request that sets no length runs to the
cap on audio (a minute or two of noise, minutes of CPU time). For such a model the default length is what speech of
the text would take instead. Real checkpoints stop at their end token, as before: this is never applied to them.
"""

from __future__ import annotations

import unicodedata

# Typical read speech: about 15 characters a second of alphabetic text (some 150 words a minute) and 5 a second of
# Chinese, Japanese or Korean, whose characters are syllables or words.
LATIN_CHARS_PER_S = 15.0
CJK_CHARS_PER_S = 5.0
MIN_SPEECH_S = 1.0


def estimated_speech_seconds(text: str) -> float:
    """About how long a speaker takes to read `text` aloud; at least a second."""
    num_cjk = sum(1 for char in text if _is_cjk(char))
    num_other = sum(1 for char in text if not char.isspace()) - num_cjk
    return max(MIN_SPEECH_S, num_cjk / CJK_CHARS_PER_S + num_other / LATIN_CHARS_PER_S)


def _is_cjk(char: str) -> bool:
    name = unicodedata.name(char, "")
    return name.startswith(("CJK UNIFIED", "CJK COMPATIBILITY IDEOGRAPH", "HIRAGANA", "KATAKANA", "HANGUL"))
