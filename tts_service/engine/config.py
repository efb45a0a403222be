"""The engine's one configuration. Every number has its single default here; the runner's and the
scheduler's settings are derived from it, never written back into it.

It imports neither torch nor the runner's code, so that reading the server's flags stays light.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from scheduler.scheduler import SchedulerConfig
from tts_service.runner.config import RunnerConfig

# Prompt positions beyond a request's text and audio: chat template, codec tags, speaker slot.
PROMPT_OVERHEAD_POSITIONS = 64
# Ordinary text takes at most a token per character. Rarer characters can take more (byte-level BPE):
# a request of such text that does not fit is refused as too large, never cut.
_TEXT_TOKENS_PER_CHAR = 1

CODEC_DTYPES = ("float32", "bfloat16")
CODEC_CONVOLUTION_DTYPES = ("auto", "float32", "float16")


@dataclass(frozen=True)
class EngineConfig:
    # -- loading --
    # How long a Hub download that fails for a passing reason (unreachable, overloaded) is retried before the load
    # fails: a server that cannot have its model exits rather than serve another.
    model_download_timeout_s: float = 300.0
    # -- how many requests --
    max_running: int = 128  # requests decoded per step: the largest captured graph batch
    max_waiting: int = 256  # queued requests (new and preempted) before submit() refuses
    # Runner rows; more than max_running lets parked requests keep their state without shrinking the
    # decode batch. None: max_running.
    num_slots: int | None = None
    # -- what one request may hold (sizes the KV block table) --
    max_text_chars: int = 4096  # of text, and again of instruction
    max_reference_text_chars: int = 2048  # an in-context clone's transcript
    max_audio_s: float = 120.0  # generated audio
    max_reference_audio_s: float = 60.0  # an in-context clone's reference audio, read as codec frames
    # None: room for the longest request the three limits above allow.
    max_positions_per_request: int | None = None
    # -- KV memory --
    block_size: int = 32  # KV positions per block
    num_kv_blocks: int | None = None  # None: sized from free device memory
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
    # From this many decodes in the running step, schedule the next step while it still runs and queue its frames
    # behind the running step's on the device, so that the device goes from one step's frames to the next without
    # waiting for the host's update, schedule and plan (Scheduler.schedule_ahead; one-frame chunks only): about a
    # tenth more audio per second at 128 streams on an H100. The price is one step of queueing for a request that
    # arrives after the next step was scheduled, so small batches, whose steps are far from the device's limit,
    # keep scheduling in order (BENCHMARKS.md, "steps scheduled ahead"). None: always in order.
    min_decodes_to_schedule_ahead: int | None = 64
    max_unread_audio_s: float = 10.0  # audio a request's reader may leave unread before it pauses
    # -- graphs and kernels --
    # The codec decoder's dtype: "float32", or "bfloat16", which is faster under load and whose waveform moves
    # from fp32 about as far as the reference's own bf16 decoder does (BENCHMARKS.md, "codec fidelity").
    codec_dtype: str = "float32"
    # What a float32 codec's residual units' convolutions read and write: "float32" (cuDNN's TF32 kernels round
    # their inputs to a 10-bit mantissa); "float16": the same mantissa, fp32 accumulation, each output rounded to
    # fp16 once, about a quarter off the codec's time, the waveform as far from exact fp32 as the reference's own
    # fp32 decoder's (BENCHMARKS.md, "fp16 convolutions"); or "auto": float16 for a float32 codec on CUDA,
    # float32 otherwise.
    codec_convolution_dtype: str = "auto"
    graph_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
    prefill_graph_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    prefill_graph_lengths: tuple[int, ...] = (16, 32, 64, 128, 256)
    use_cuda_graphs: bool = True
    use_fused_kernels: bool = True
    # At one or two rows, each code predictor call as one persistent kernel (runner/predictor_pass.py), about a
    # seventh off a frame; off on a GPU share capped below its SM count (MPS), where its programs cannot all run.
    use_predictor_kernel: bool = True
    # -- the step profiler --
    profile_steps: bool = False  # host and device time per phase of every step, into stats and metrics
    # -- registered voices (Base models) --
    voice_store_dir: Path | None = None  # None: kept in memory, lost when the process ends
    max_voices: int = 1000  # stored voices, all owners together
    max_voices_per_owner: int = 100  # stored voices of one owner (API key), so that no key fills the store
    # One stored voice: an in-context voice's codes take 64 bytes a frame, so 1 MiB holds about 20 minutes of them.
    max_voice_bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_running", "max_waiting", "max_text_chars", "max_reference_text_chars", "max_voices",
                     "max_voices_per_owner", "max_voice_bytes"):
            _require(getattr(self, name) >= 1, name, ">= 1")
        _require(self.num_slots is None or self.num_slots >= self.max_running, "num_slots",
                 f">= max_running ({self.max_running})")
        _require(self.min_decodes_to_schedule_ahead is None or self.min_decodes_to_schedule_ahead >= 0,
                 "min_decodes_to_schedule_ahead", ">= 0, or None")
        for name in ("max_audio_s", "max_reference_audio_s", "max_unread_audio_s"):
            _require(math.isfinite(getattr(self, name)) and getattr(self, name) > 0, name, "> 0")
        _require(math.isfinite(self.model_download_timeout_s) and self.model_download_timeout_s >= 0,
                 "model_download_timeout_s", ">= 0")
        _require(self.max_positions_per_request is None or self.max_positions_per_request >= 1,
                 "max_positions_per_request", ">= 1")
        _require(self.codec_dtype in CODEC_DTYPES, "codec_dtype", f"one of {', '.join(CODEC_DTYPES)}")
        _require(self.codec_convolution_dtype in CODEC_CONVOLUTION_DTYPES, "codec_convolution_dtype",
                 f"one of {', '.join(CODEC_CONVOLUTION_DTYPES)}")
        _require(self.codec_convolution_dtype != "float16" or self.codec_dtype == "float32", "codec_convolution_dtype",
                 "auto or float32 unless codec_dtype is float32")

    @property
    def num_runner_slots(self) -> int:
        return self.max_running if self.num_slots is None else self.num_slots

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
            prefill_graph_lengths=self.prefill_graph_lengths, profile_steps=self.profile_steps)

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


def _require(condition: bool, name: str, requirement: str) -> None:
    if not condition:
        raise ValueError(f"EngineConfig.{name} must be {requirement}")
