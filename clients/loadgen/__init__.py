"""Open-loop load generator for the qwen3-tts gRPC service: the service's benchmark of record.

    python -m clients.loadgen --server localhost:50051 --rate 10 --duration 30 --rpc mixed --out load.json

Arrivals are a seeded Poisson process drawn up front; each request starts at its scheduled time
whether or not earlier ones have finished, so a slow server meets the same load a real one would
(a closed loop would slow its own arrivals down and hide the queueing). Each request's text is drawn,
with the same seed, from texts.jsonl: 540 sentences written for this repository (18% Chinese, sent
with language "chinese"; English 3 to 40 words, Chinese 3 to 60 characters; questions, numbers and
dates, names, lists, dialogue, instructions, notices, short replies and long explanations);
`--language` keeps one language only. Per request it records the time to first audio (from the
request, or from the first text fragment of a bidirectional call, to the first chunk with audio),
the end-to-end time, the real-time factor (end-to-end time over audio seconds), and underruns two
ways. Strict (the project's definition): playback starts when the first chunk arrives, with no
pre-roll, each later chunk is due at that moment plus its offset, a chunk that arrives after its due
time is late by the difference, and any late chunk makes the request an underrun. With a 100 ms
continuity threshold (vLLM-Omni's definition): the player pauses when it runs out of audio and
resumes when the next chunk arrives, and the request is an underrun only if one such pause exceeds
100 ms. With `--concurrency N --requests M` instead of `--rate` and `--duration`, it runs a closed loop: N
calls kept in flight, each new one sent as soon as one ends, M in all. That measures the service's ceiling
(audio seconds per second at N streams), which an open loop never offers. The summary gives TTFA
p50/p90/p95/p99, the peak number of requests in flight (sent and not finished, failed ones included), audio
seconds delivered per wall-clock second, both underrun counts, and errors by gRPC status. The generator's own
lag behind its schedule is recorded too, so a saturated client is visible rather than mistaken for a slow
server.
"""
