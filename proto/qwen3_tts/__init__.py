"""The qwen3-tts API's Python package: `qwen3_tts.v1` holds the .proto and the code generated from it."""
