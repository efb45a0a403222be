"""Which model the front doors load when none is named, and the one the quick-start command falls back to offline.

Kept apart from `checkpoint` (which imports torch) so that reading the configuration stays light.
"""

DEFAULT_MODEL = "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"
# A tiny random-weight model built in memory: the whole pipeline runs, but its audio is noise.
OFFLINE_FALLBACK_MODEL = "random:tiny-custom_voice"
