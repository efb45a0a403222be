"""Version 1 of the qwen3-tts API: `tts.proto`, and `protocol` with the modules generated from it."""
