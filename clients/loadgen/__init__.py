"""Open-loop load generator for the qwen3-tts gRPC service: the service's benchmark of record.

    python -m clients.loadgen --server localhost:50051 --rate 10 --duration 30 --rpc mixed --out load.json

Arrivals are a seeded Poisson process drawn up front; each request starts at its scheduled time
whether or not earlier ones have finished, so a slow server meets the same load a real one would
(a closed loop would slow its own arrivals down and hide the queueing). Each request's text is drawn,
with the same seed, from texts.jsonl: 540 sentences written for this repository (18% Chinese, sent
with language "chinese"; English 3 to 40 words, Chinese 3 to 60 characters; questions, numbers and
dates, names, lists, dialogue, instructions, notices, short replies and long explanations);
`--language` keeps one language only. Before it plans, it reads the server's limits (ListVoices) and keeps
every request inside them: audio capped at the server's max_audio_seconds (or `--max-audio-seconds`, if
lower), text cut to its max_text_chars. Per request it records the time to first audio (from the
request, or from the first text fragment of a bidirectional call, to the first chunk with audio),
the end-to-end time, the real-time factor (end-to-end time over audio seconds), and its stalls, with
the definition of the server's underrun metric: playback starts when the first chunk arrives, with no
pre-roll; whenever the player runs out of audio it pauses until the next chunk arrives and resumes from
there, and each such pause is one stall, counted once. A request with any stall underran. The stalls longer
than 100 ms are counted again on their own, as vLLM-Omni's continuity threshold counts them. With
`--concurrency N --requests M` instead of `--rate` and `--duration`, it runs a closed loop: N calls kept in
flight, each new one sent as soon as one ends, M in all. That measures the service's ceiling (audio seconds per
second at N streams), which an open loop never offers. The summary gives TTFA p50/p90/p95/p99, the peak number
of requests in flight (sent and not finished, failed ones included), audio seconds delivered per wall-clock
second, the requests that stalled at all and those that stalled past 100 ms, the stalls' total and longest
seconds, and errors by gRPC status. The generator's own lag behind its schedule is recorded too, so a saturated
client is visible rather than mistaken for a slow server; `--processes N` shares an open loop's schedule out over N
worker processes (`processes.py`) for rates one process cannot keep. Every request speaks `--speaker` (a CustomVoice
model's), or with `--voice-id` a registered voice (a Base model's clone, made with `qwen3-tts voice create`), or
with `--reference-audio` (and `--reference-text`) a recording sent with every request, cloned by the server.
"""
