"""The front doors: the gRPC server (`qwen3-tts-server`) and the offline `qwen3-tts-synthesize` command.

They translate a protocol into engine terms and back, and talk to nothing below the engine's public
surface (`tts_service.engine`).
"""
