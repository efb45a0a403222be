"""Every Prometheus metric the service exports, defined once.

Names follow Prometheus conventions: a `qwen3_tts_` prefix, base units in the name (seconds),
`_total` on counters, no per-request labels. `model` and `mode` label every request metric so a
dashboard can compare deployments. What the engine alone knows (step time, batch size) arrives
through `observe_step`, called once per step with numbers the engine already has on the host: no
device synchronisation is added for metrics. Live gauges (running, waiting, parked requests, KV
blocks) and the preemption count are read from the engine only when Prometheus scrapes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from observability.calls import CallRecord, RequestTimeline

# Fine below 100 ms, where the service's targets are; coarse above, where only overload lives.
TIME_TO_FIRST_AUDIO_BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.2,
                               0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)
# Around 1.0, the line between keeping up with playback and falling behind.
REALTIME_FACTOR_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0,
                           5.0)
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0, 300.0)
STEP_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.2,
                0.5)
GAP_BUCKETS = (0.01, 0.025, 0.05, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0)
UNDERRUN_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
PHASE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.012, 0.016, 0.025, 0.05, 0.1, 0.25)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)
_MODES = {"custom_voice": "custom_voice", "voice_design": "voice_design", "base": "voice_clone"}


def mode_label(model_type: str) -> str:
    """The `mode` label of a checkpoint type: custom_voice, voice_design or voice_clone."""
    return _MODES.get(model_type, model_type)


@dataclass(frozen=True)
class StepObservation:
    """One engine step, as the engine's loop measured it on the host."""

    num_decodes: int
    num_prefills: int
    num_codec_frames: int
    step_s: float
    # Prefill calls outside the captured CUDA graphs (a batch or prompt beyond every captured bucket).
    num_eager_prefills: int = 0
    # Streams in an in-context clone voice that started by decoding its reference frames, and from a kept state.
    num_references_decoded: int = 0
    num_references_kept: int = 0
    # The step profiler's seconds per phase (engine loop on the host, and device time); None when it is off.
    phases: Mapping[str, float] | None = None


@dataclass(frozen=True)
class LiveState:
    """Readers of the engine's current state, called at scrape time."""

    num_running: Callable[[], int]
    num_waiting: Callable[[], int]
    num_parked: Callable[[], int]
    num_preemptions_total: Callable[[], int]
    num_kv_blocks_used: Callable[[], int]
    num_kv_blocks_total: Callable[[], int]
    num_cores_running: Callable[[], int]


class ServiceMetrics:
    def __init__(self, model: str, mode: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._labels = {"model": model, "mode": mode}
        names = ("model", "mode")

        def histogram(name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, documentation, names, buckets=buckets, registry=self.registry)

        self.time_to_first_audio = histogram("qwen3_tts_time_to_first_audio_seconds",
                                             "From a request's arrival to its first audio chunk.",
                                             TIME_TO_FIRST_AUDIO_BUCKETS)
        self.request_duration = histogram("qwen3_tts_request_duration_seconds",
                                          "A synthesis call from start to end.", DURATION_BUCKETS)
        self.queue_time = histogram("qwen3_tts_queue_seconds", "From a request's arrival to its admission.",
                                    DURATION_BUCKETS)
        self.prefill_time = histogram("qwen3_tts_prefill_seconds",
                                      "From a request's admission to its first frame (the step carrying its prefill).",
                                      STEP_BUCKETS)
        self.realtime_factor = histogram("qwen3_tts_realtime_factor",
                                         "A completed call's duration over the audio it produced.",
                                         REALTIME_FACTOR_BUCKETS)
        self.chunk_gap = histogram("qwen3_tts_audio_chunk_gap_seconds",
                                   "Time between consecutive audio chunks sent on one call.", GAP_BUCKETS)
        self.underrun = histogram("qwen3_tts_underrun_seconds",
                                  "Per streamed call, how long a listener playing from its first chunk was "
                                  "starved of audio, each stall counted once.",
                                  UNDERRUN_BUCKETS)
        self.step_time = Histogram("qwen3_tts_engine_step_seconds", "One engine step: schedule, execute, update.",
                                   names, buckets=STEP_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("qwen3_tts_engine_batch_size", "Requests decoding a frame in one step.",
                                    names, buckets=BATCH_BUCKETS, registry=self.registry)
        # Only with the step profiler on (--profile-steps): where a step's time goes, and the server's own work.
        self.step_phase_time = Histogram("qwen3_tts_engine_step_phase_seconds",
                                         "One phase of an engine step: host phases of the loop, device_* on the GPU.",
                                         (*names, "phase"), buckets=PHASE_BUCKETS, registry=self.registry)
        self.server_phase_time = Histogram("qwen3_tts_server_phase_seconds",
                                           "The server's work per audio chunk: encoding it, and writing it out.",
                                           (*names, "phase"), buckets=PHASE_BUCKETS, registry=self.registry)
        self.first_audio_path = Histogram(
            "qwen3_tts_first_audio_path_seconds",
            "A streamed call's way to its first audio outside the engine's own time to first audio: from the call's "
            "start to its request's arrival in the engine (to_engine: checks, voice, the crossing to the engine "
            "core; for streamed text, until its first words), from the engine's first audio to the server's stream "
            "(from_engine), and from there to gRPC (to_grpc: the handler waking, encoding, the write).",
            (*names, "phase"), buckets=PHASE_BUCKETS, registry=self.registry)
        self.requests = Counter("qwen3_tts_requests",
                                "Finished speech calls, and calls of any RPC refused before they ran, by RPC, gRPC "
                                "status (on either front door) and finish reason (empty for a request that never ran).",
                                (*names, "rpc", "status", "finish_reason"), registry=self.registry)
        self.audio_seconds = Counter("qwen3_tts_audio_seconds", "Audio generated.", names, registry=self.registry)
        self.frames = Counter("qwen3_tts_frames", "Codec frames generated.", names, registry=self.registry)
        self.segment_retries = Counter("qwen3_tts_segment_retries",
                                       "Segments of long texts made again once: ended far too early for their text "
                                       "(early_end) or cut where they ran far past it (runaway).",
                                       (*names, "reason"), registry=self.registry)
        self.input_tokens = Counter("qwen3_tts_input_tokens", "Text tokens of requests' own text.", names,
                                    registry=self.registry)
        self.prefills = Counter("qwen3_tts_engine_prefills", "Requests prefilled (admitted or resumed).", names,
                                registry=self.registry)
        self.eager_prefills = Counter("qwen3_tts_engine_eager_prefills",
                                      "Prefill calls run outside the captured CUDA graphs (a batch or prompt beyond "
                                      "every captured bucket): each makes its step far longer.", names,
                                      registry=self.registry)
        self.eager_prefills.labels(**self._labels)  # exported at 0 from the start: most servers never run one
        self.voice_reference_starts = Counter(
            "qwen3_tts_engine_voice_reference_starts",
            "Streams in an in-context clone voice, by how they started: decoding the voice's reference frames, or "
            "from the codec state they left kept (--max-primed-voices).", (*names, "reference"), registry=self.registry)
        self.build_info = Info("qwen3_tts_build", "Version, model, dtype and device of this server.",
                               registry=self.registry)

    def observe_step(self, step: StepObservation) -> None:
        labels = self._labels
        self.step_time.labels(**labels).observe(step.step_s)
        for phase, seconds in (step.phases or {}).items():
            self.step_phase_time.labels(**labels, phase=phase).observe(seconds)
        if step.num_decodes:
            self.batch_size.labels(**labels).observe(step.num_decodes)
        if step.num_prefills:
            self.prefills.labels(**labels).inc(step.num_prefills)
        if step.num_eager_prefills:
            self.eager_prefills.labels(**labels).inc(step.num_eager_prefills)
        if step.num_references_decoded:
            self.voice_reference_starts.labels(**labels, reference="decoded").inc(step.num_references_decoded)
        if step.num_references_kept:
            self.voice_reference_starts.labels(**labels, reference="kept").inc(step.num_references_kept)

    def observe_server_phase(self, phase: str, seconds: float) -> None:
        """The step profiler's view of the server: `encode` or `write` time of one audio chunk."""
        self.server_phase_time.labels(**self._labels, phase=phase).observe(seconds)

    def observe_refusal(self, rpc: str, status: str) -> None:
        """A call refused before it ran (no valid key, the server not serving): counted, nothing else observed."""
        self.requests.labels(**self._labels, rpc=rpc, status=status, finish_reason="").inc()

    def observe_call(self, record: CallRecord, status: str) -> None:
        """A finished call, with the name of the gRPC status it ended with."""
        labels = self._labels
        result = record.result
        self.requests.labels(**labels, rpc=record.rpc, status=status, finish_reason=record.finish_reason(status)).inc()
        end_to_end_s = time.monotonic() - record.started
        self.request_duration.labels(**labels).observe(end_to_end_s)
        underrun_s = record.underrun_s()
        if underrun_s is not None:
            self.underrun.labels(**labels).observe(underrun_s)
        for gap in record.chunk_gaps_s():
            self.chunk_gap.labels(**labels).observe(gap)
        if result is None:
            return
        timeline = result.timeline
        for histogram, value in ((self.queue_time, timeline.queue_s), (self.prefill_time, timeline.prefill_s),
                                 (self.time_to_first_audio, timeline.time_to_first_audio_s)):
            if value is not None:
                histogram.labels(**labels).observe(value)
        self._observe_first_audio_path(record, timeline)
        if status == "OK" and result.audio_s > 0:
            self.realtime_factor.labels(**labels).observe(end_to_end_s / result.audio_s)
        self.audio_seconds.labels(**labels).inc(result.audio_s)
        self.frames.labels(**labels).inc(result.num_frames)
        self.input_tokens.labels(**labels).inc(result.num_input_tokens)
        for reason in result.segment_retries:
            self.segment_retries.labels(**labels, reason=reason).inc()

    def _observe_first_audio_path(self, record: CallRecord, timeline: RequestTimeline) -> None:
        received, first_audio = record.first_audio_received, timeline.first_audio
        if received is None or first_audio is None or not record.sent_at_s:
            return
        labels = self._labels
        for phase, seconds in (("to_engine", timeline.arrival - record.started),
                               ("from_engine", received - first_audio),
                               ("to_grpc", record.sent_at_s[0] - received)):
            self.first_audio_path.labels(**labels, phase=phase).observe(seconds)

    def watch(self, live: LiveState) -> None:
        """Gauges that read the engine's state when scraped (so they cost nothing between scrapes)."""
        labels = self._labels
        names = tuple(labels)
        for name, documentation, read in (
                ("qwen3_tts_requests_running", "Requests holding a decode slot.", live.num_running),
                ("qwen3_tts_requests_waiting", "Requests queued for admission.", live.num_waiting),
                ("qwen3_tts_requests_parked", "Running requests waiting for more text.", live.num_parked),
                ("qwen3_tts_kv_blocks_used", "Talker KV-cache blocks held by requests.", live.num_kv_blocks_used),
                ("qwen3_tts_kv_blocks", "Talker KV-cache blocks in all.", live.num_kv_blocks_total),
                ("qwen3_tts_engine_cores_running", "Engine cores running: one per device (--device); a core "
                 "that exited is started again.", live.num_cores_running)):
            Gauge(name, documentation, names, registry=self.registry).labels(**labels).set_function(read)
        self.registry.register(_CounterReader(
            "qwen3_tts_preemptions", "Requests that gave their KV memory back and resumed by recomputing it.",
            labels, live.num_preemptions_total))

    def set_cuda_graphs(self, batch_sizes_by_kind: Mapping[str, list[int]]) -> None:
        """The CUDA graphs the runner captured, given as each graph's batch size by kind."""
        names = (*self._labels, "kind")
        count = Gauge("qwen3_tts_cuda_graphs", "CUDA graphs captured at start-up, by kind.", names,
                      registry=self.registry)
        largest = Gauge("qwen3_tts_cuda_graph_max_batch_size",
                        "Largest batch that a captured graph of this kind covers.",
                        names, registry=self.registry)
        for kind, sizes in batch_sizes_by_kind.items():
            count.labels(**self._labels, kind=kind).set(len(sizes))
            largest.labels(**self._labels, kind=kind).set(max(sizes, default=0))


class _CounterReader(Collector):
    """A counter whose total the engine already keeps: read when scraped rather than mirrored on every change."""

    def __init__(self, name: str, documentation: str, labels: Mapping[str, str], read: Callable[[], int]) -> None:
        self._name = name
        self._documentation = documentation
        self._labels = dict(labels)
        self._read = read

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self._name, self._documentation, labels=tuple(self._labels))
        family.add_metric(tuple(self._labels.values()), self._read())
        yield family
