"""The eager path: one plain generate loop with no graphs and no paging, the correctness baseline that the
batched runner is held against (and that the parity tests hold against `qwen-tts`)."""
