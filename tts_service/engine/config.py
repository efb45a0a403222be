"""The engine's one configuration. Every number has its single default here, declared once with its check and, for
what the server exposes, the help of its flag (`settings.setting`); the runner's and the scheduler's settings are
derived from it, never written back into it.

It imports neither torch nor the runner's code, so that reading the server's flags stays light.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from scheduler.scheduler import SchedulerConfig
from tts_service.engine.settings import Check, above, at_least, check_fields, count_or_off, one_of, require, setting
from tts_service.runner.config import RunnerConfig

# Prompt positions beyond a request's text and audio: chat template, codec tags, speaker slot.
PROMPT_OVERHEAD_POSITIONS = 64
# Ordinary text takes at most a token per character. Rarer characters can take more (byte-level BPE):
# a request of such text that does not fit is refused as too large, never cut.
_TEXT_TOKENS_PER_CHAR = 1

CODEC_DTYPES = ("float32", "bfloat16")
CODEC_CONVOLUTION_DTYPES = ("auto", "float32", "float16")
# A directory not made yet is made at start.
_DIRECTORY = Check("a directory", lambda path: not path.exists() or path.is_dir())


@dataclass(frozen=True)
class EngineConfig:
    # -- loading --
    # A server that cannot have its model exits rather than serve another.
    aligner_model: str | None = setting(None, "forced aligner for word timestamps, loaded beside the model on the "
                                              "same device: a directory, a Hugging Face repo id (e.g. "
                                              "Qwen/Qwen3-ForcedAligner-0.6B) or random:tiny / random:0.6b; unset: "
                                              "none (a request asking for word timestamps gets FAILED_PRECONDITION)")
    model_download_timeout_s: float = setting(
        300.0, "how long a Hugging Face Hub download that fails for a reason that may pass (the Hub unreachable, "
               "overloaded or rate limiting) is retried with backoff before the server exits with status 1; the "
               "server never serves another model in place of --model",
        flag="model-download-timeout-seconds", check=at_least(0))
    # -- how many requests --
    max_running: int = setting(128, "requests generating at once: the decode batch, up to the largest captured "
                                    "graph batch", flag="max-concurrent", check=at_least(1))
    max_waiting: int = setting(256, "queued requests (new and preempted) beyond which new ones get "
                                    "RESOURCE_EXHAUSTED", check=at_least(1))
    # Runner rows; more than max_running lets parked requests keep their state without shrinking the
    # decode batch. None: max_running.
    num_slots: int | None = None
    # -- what one request may hold (sizes the KV block table) --
    max_text_chars: int = setting(4096, "most characters of text one generation may hold: a streamed utterance's "
                                        "text, a segment of a longer one, an instruction", check=at_least(1))
    # -- long text --
    max_document_chars: int = setting(200_000, "most characters of a whole text one request may carry "
                                               "(Synthesize, SynthesizeOnline, HTTP): one longer than "
                                               "--max-segment-chars is spoken segment by segment as one stream",
                                      check=at_least(1))
    max_segment_chars: int = setting(1000, "longest run of whole sentences generated in one go; a longer whole text "
                                           "is cut at sentences (then clauses, then between words) and its segments "
                                           "spoken one after another in the same voice", check=at_least(1))
    max_document_audio_s: float = setting(4 * 3600.0, "longest audio one whole-text request may generate in all, "
                                                      "each of its segments within --max-audio-seconds",
                                          flag="max-document-audio-seconds", check=above(0))
    max_reference_text_chars: int = setting(2048, "most characters of a voice clone's reference transcript",
                                            check=at_least(1))
    max_audio_s: float = setting(120.0, "longest audio one generation (a request, or a segment of a long text) may "
                                        "make, and the cap of one that sets none", flag="max-audio-seconds",
                                 check=above(0))
    # Read as codec frames.
    max_reference_audio_s: float = setting(60.0, "longest voice-cloning reference recording",
                                           flag="max-reference-audio-seconds", check=above(0))
    # None: room for the longest request the three limits above allow.
    max_positions_per_request: int | None = setting(None, check=at_least(1))
    # -- KV memory --
    block_size: int = 32  # KV positions per block
    num_kv_blocks: int | None = setting(None, "KV cache size in blocks; unset: sized from free GPU memory",
                                        flag="kv-blocks", check=at_least(1))
    kv_memory_fraction: float = 0.6  # of free device memory, when sizing the KV cache from it
    # -- the step policy --
    max_prefill_positions_per_step: int = 4096  # a step's prefill budget; its first admission is exempt
    min_playback_slack_s: float = 0.5  # below this, admissions shrink to the at-risk prefill budget
    max_prefill_positions_at_risk: int = 256  # a step's prefill budget while a stream is at risk
    # Frames per codec chunk, first chunks first; the last size repeats. One frame per chunk means every
    # step decodes each stream's newest frame in one batched codec call right after the frames, and a
    # frame's audio leaves while the next step's frames run: growing chunks (1, 2, 4, 8, 12) cost more per
    # step at load (one call per distinct length) and ask for steps of half a frame's duration while a
    # stream starts (BENCHMARKS.md, "one codec call per step").
    codec_chunk_schedule: tuple[int, ...] = (1,)
    # The next step's frames queue behind the running step's on the device (Scheduler.schedule_ahead; one-frame
    # chunks only), so that the device never waits for the host's update, schedule and plan. The price is one step
    # of queueing for a request that arrives after the next step was scheduled, so small batches, whose steps are
    # far from the device's limit, keep scheduling in order (BENCHMARKS.md, "steps scheduled ahead").
    min_decodes_to_schedule_ahead: int | None = setting(
        64, "from this many decodes a step, schedule the next step while it runs, so that the GPU never waits for "
            "the host between steps (about a tenth more audio per second at 128 streams, one step more before a "
            "new request's prefill); off: every step in order",
        check=Check(">= 0 or off", lambda count: count >= 0), parse=count_or_off)
    max_unread_audio_s: float = setting(10.0, "audio a streaming reader may leave unread before its request pauses",
                                        flag="max-unread-audio-seconds", check=above(0))
    # -- graphs and kernels --
    # bfloat16 is faster under load, and its waveform moves from fp32 about as far as the reference's own bf16
    # decoder's does (BENCHMARKS.md, "codec fidelity").
    codec_dtype: str = setting("float32", "the codec decoder's dtype: float32, or bfloat16, faster under load, its "
                                          "waveform then about as far from fp32 as the reference's own bf16 "
                                          "decoder's", check=one_of(*CODEC_DTYPES), parse=str.lower)
    # float32 runs cuDNN's TF32 kernels, which round their inputs to a 10-bit mantissa; float16 keeps that mantissa,
    # accumulates in fp32 and rounds each output to fp16 once: about a quarter off the codec's time, the waveform as
    # far from exact fp32 as the reference's own fp32 decoder's (BENCHMARKS.md, "fp16 convolutions").
    codec_convolution_dtype: str = setting(
        "auto", "what a float32 codec's residual units' convolutions read and write: auto (float16 on CUDA, "
                "float32 elsewhere), float32 (cuDNN runs them in TF32), or float16 with fp32 accumulation, faster "
                "and as near exact fp32 as the reference's own fp32 decoder",
        check=one_of(*CODEC_CONVOLUTION_DTYPES), parse=str.lower)
    graph_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
    prefill_graph_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    prefill_graph_lengths: tuple[int, ...] = (16, 32, 64, 128, 256)
    use_cuda_graphs: bool = True
    use_fused_kernels: bool = True
    # runner/predictor_pass.py; its programs cannot all run on a GPU share capped below the SM count (MPS).
    use_predictor_kernel: bool = setting(
        True, "at one or two streams, run each code predictor call as one persistent kernel (one program per SM, "
              "about a seventh off a frame); --no-predictor-kernel for a GPU share capped below its SM count, such "
              "as MPS's active-thread percentage", flag="predictor-kernel")
    # -- the step profiler --
    profile_steps: bool = setting(False, "time every engine step's phases (host and GPU) and the server's per-chunk "
                                         "work into the metrics (qwen3_tts_*_phase_seconds)")
    # -- registered voices (Base models) --
    voice_store_dir: Path | None = setting(None, "directory keeping registered voices (CreateVoice) across restarts; "
                                                 "unset: in memory, lost when the server stops",
                                           flag="voice-store", check=_DIRECTORY)
    max_voices: int = setting(1000, "registered voices stored, all callers together; CreateVoice beyond gets "
                                    "RESOURCE_EXHAUSTED", check=at_least(1))
    # So that no key fills the store.
    max_voices_per_owner: int = setting(100, "registered voices one caller (API key; without keys, all callers share "
                                             "one namespace) may keep; CreateVoice beyond gets RESOURCE_EXHAUSTED",
                                        flag="max-voices-per-caller", check=at_least(1))
    # An in-context voice's codes take 64 bytes a frame, so 1 MiB holds about 20 minutes of them.
    max_voice_bytes: int = setting(1024 * 1024, "largest registered voice as stored (an in-context voice grows with "
                                                "its reference)", check=at_least(1))
    # At the released codec's size a stream's state is about 5 MB in float32 (2.5 in bfloat16).
    max_primed_voices: int = setting(64, "in-context clone voices (registered or sent inline) whose codec state after "
                                         "their reference audio stays on the GPU, most recently used first (about 5 "
                                         "MB each), so that a request in one of them starts without decoding that "
                                         "reference again; 0: decode it for every request", check=at_least(0))

    def __post_init__(self) -> None:
        check_fields(self)
        require(self, self.num_slots is None or self.num_slots >= self.max_running, "num_slots",
                f">= max_running ({self.max_running})")
        require(self, self.codec_convolution_dtype != "float16" or self.codec_dtype == "float32",
                "codec_convolution_dtype", f"auto or float32 with codec_dtype {self.codec_dtype!r}")
        require(self, self.max_document_chars >= self.max_text_chars, "max_document_chars",
                f">= max_text_chars ({self.max_text_chars})")
        require(self, self.max_document_audio_s >= self.max_audio_s, "max_document_audio_s",
                f">= max_audio_s ({self.max_audio_s:g})")

    @property
    def num_runner_slots(self) -> int:
        return self.max_running if self.num_slots is None else self.num_slots

    @property
    def segment_chars(self) -> int:
        """A long text's segment budget: a segment is one generation, which holds at most max_text_chars."""
        return min(self.max_segment_chars, self.max_text_chars)

    def is_segmented(self, text: str) -> bool:
        """Whether a whole text is spoken segment by segment (the engine's rule, segmented.py, read by the API)."""
        return len(text) > self.segment_chars

    def positions_per_request(self, frame_rate_hz: float) -> int:
        """Room for the longest request: instruction, text and transcript, reference frames, audio frames."""
        if self.max_positions_per_request is not None:
            return self.max_positions_per_request
        max_text_tokens = _TEXT_TOKENS_PER_CHAR * (2 * self.max_text_chars + self.max_reference_text_chars)
        return (math.ceil(self.max_audio_s * frame_rate_hz) + math.ceil(self.max_reference_audio_s * frame_rate_hz)
                + max_text_tokens + PROMPT_OVERHEAD_POSITIONS)

    def max_unread_frames(self, frame_rate_hz: float) -> int:
        return math.ceil(self.max_unread_audio_s * frame_rate_hz)

    def runner_config(self, frame_rate_hz: float) -> RunnerConfig:
        # The codec is captured for exactly the chunk lengths the scheduler will ask for.
        return RunnerConfig(
            max_num_slots=self.num_runner_slots, block_size=self.block_size,
            max_positions_per_request=self.positions_per_request(frame_rate_hz), num_kv_blocks=self.num_kv_blocks,
            kv_memory_fraction=self.kv_memory_fraction, graph_batch_sizes=self.graph_batch_sizes,
            use_cuda_graphs=self.use_cuda_graphs, use_fused_kernels=self.use_fused_kernels,
            use_predictor_kernel=self.use_predictor_kernel,
            codec_graph_chunk_sizes=self.codec_chunk_schedule,
            prefill_graph_batch_sizes=self.prefill_graph_batch_sizes,
            prefill_graph_lengths=self.prefill_graph_lengths, profile_steps=self.profile_steps,
            max_primed_voices=self.max_primed_voices)

    def scheduler_config(self, num_kv_blocks: int, frame_rate_hz: float) -> SchedulerConfig:
        """The scheduler's settings once the runner has allocated `num_kv_blocks`."""
        return SchedulerConfig(
            max_running=self.max_running, max_waiting=self.max_waiting,
            max_prefill_positions_per_step=self.max_prefill_positions_per_step, block_size=self.block_size,
            num_kv_blocks=num_kv_blocks, codec_chunk_schedule=self.codec_chunk_schedule,
            min_playback_slack_s=self.min_playback_slack_s,
            max_prefill_positions_at_risk=self.max_prefill_positions_at_risk,
            frame_duration_s=1.0 / frame_rate_hz, max_slots=self.num_runner_slots,
            max_positions_per_request=self.positions_per_request(frame_rate_hz))


