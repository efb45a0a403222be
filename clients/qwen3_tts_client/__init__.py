"""Python client for the qwen3-tts gRPC service: TtsClient (blocking), AsyncTtsClient (asyncio), and the
`qwen3-tts` command (cli.py). The request and response messages are the API's own (tts_pb2)."""

from clients.qwen3_tts_client.client import (
    AsyncTtsClient,
    AudioFormat,
    CancelUtterance,
    CloseUtterance,
    Connection,
    Flush,
    Generation,
    Say,
    TtsClient,
    Voice,
    VoiceReference,
)
from qwen3_tts.v1.protocol import tts_pb2, tts_pb2_grpc

__all__ = ["AsyncTtsClient", "AudioFormat", "CancelUtterance", "CloseUtterance", "Connection", "Flush", "Generation",
           "Say", "TtsClient", "Voice", "VoiceReference", "tts_pb2", "tts_pb2_grpc"]
