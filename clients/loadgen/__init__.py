"""Open-loop load generator for the qwen3-tts gRPC service: the service's benchmark of record.

    python -m clients.loadgen --server localhost:50051 --rate 10 --duration 30 --rpc mixed --out load.json

Arrivals are a seeded Poisson process drawn up front; each request starts at its scheduled time
whether or not earlier ones have finished, so a slow server meets the same load a real one would
(a closed loop would slow its own arrivals down and hide the queueing). Per request it records the
time to first audio (from the request, or from the first text fragment of a bidirectional call, to
the first chunk with audio), the end-to-end time, the real-time factor (end-to-end time over audio
seconds), and underruns: playback starts when the first chunk arrives, each later chunk is due at
that moment plus its offset, and a chunk that arrives after its due time is late by the difference.
Errors are counted by gRPC status. The generator's own lag behind its schedule is recorded too, so
a saturated client is visible rather than mistaken for a slow server.
"""
