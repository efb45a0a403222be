"""A gRPC streaming text-to-speech service for the Qwen3-TTS 12 Hz models."""
