"""The engine: one asyncio task runs schedule -> execute -> update and fans results out to streams.

It only moves data. The scheduler decides who runs; the runner (in a single worker thread, so
the event loop stays free for the server) decides how tensors are laid out; the engine keeps each
request's prompt, text and frames, turns a SchedulerOutput into runner work, and turns the
outcome back into audio chunks and summaries on the request streams.

From `min_decodes_to_schedule_ahead` decodes a step, the loop is pipelined: it schedules the next step while
the last one runs (Scheduler.schedule_ahead) and has the runner queue its frames before collecting the last
step's, so that the device goes from one step's frames to the next without waiting for the host.

Every call (submit, append_text, close_text, abort) must come from the event loop's thread:
the scheduler takes no locks. The loop sleeps on an event when there is no work, waking for new
work or for the earliest request deadline; it never polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import functools
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np

from observability.calls import RequestTimeline
from observability.metrics import StepObservation
from scheduler.outputs import CodecChunk, FreedItem, RequestEvent, SchedulerOutput, StepResult
from scheduler.request import FinishReason, Request
from scheduler.scheduler import Scheduler
from tts_service.engine.aligner_worker import AlignerWorker, load_aligner
from tts_service.engine.config import EngineConfig
from tts_service.engine.model_info import ModelInfo
from tts_service.engine.segmented import SegmentDoor, SegmentedRequests
from tts_service.engine.step_observers import StepObservers
from tts_service.engine.step_work import (
    AudioInFlight,
    CodecWork,
    StepDone,
    StepFrameWork,
    StepWork,
    finish_step,
    has_all_audio_queued,
    run_step,
    start_frames,
)
from tts_service.engine.streamed_segments import SegmentOutput, StreamedSegmentDoor, StreamedSegmentedRequests
from tts_service.engine.streams import AudioChunk, RequestStream, SynthesisRequest, SynthesisSummary
from tts_service.engine.text_stream import IncrementalTokenizer, TextTokenization
from tts_service.engine.voice_files import RegisteredVoice, VoiceShape
from tts_service.engine.voice_store import VoiceLimits, VoiceNotFoundError, VoiceStore
from tts_service.engine.warm_up import warm_up
from tts_service.model.aligner import AlignmentItem, WordTiming
from tts_service.model.checkpoint import LoadedModel, LoadOptions
from tts_service.model.loading import load_model
from tts_service.model.prompts import Prompt, PromptBuilder, PromptError, SynthesisInput, VoiceClone
from tts_service.model.segments import SegmentBounds
from tts_service.model.voice_clone import clone_voice
from tts_service.runner.runner import AudioRestart, DecodeInput, ModelRunner, PendingStep, PrefillInput, StepInput

logger = logging.getLogger(__name__)

Clock = Callable[[], float]
T = TypeVar("T")


def voice_shape(model: LoadedModel) -> VoiceShape:
    """What a registered voice must look like for `model`, which can clone."""
    encoder = model.speaker_encoder
    assert encoder is not None and model.config.speaker_encoder is not None
    return VoiceShape(embedding_size=model.config.speaker_encoder.enc_dim,
                      num_code_groups=model.config.talker.num_code_groups, device=encoder.fc.weight.device)


@dataclass
class EngineStats:
    """Running totals the engine keeps about its own steps (read them as differences over a window)."""

    num_steps: int = 0
    num_decoded_frames: int = 0
    num_prefills: int = 0
    num_codec_frames: int = 0
    num_eager_prefills: int = 0  # prefill calls outside the captured graphs
    num_references_decoded: int = 0  # clone voices' streams started by decoding the voice's reference frames
    num_references_kept: int = 0  # ... and from the kept state those frames left (runner.primed_voices)
    num_steps_ahead: int = 0  # steps scheduled, and their frames queued, before the step before was collected
    execute_s: float = 0.0  # in the runner (worker thread), GPU work included
    loop_s: float = 0.0  # in the loop between schedule() and the end of fan-out, execute_s included
    last_step_s: float = 0.0
    # With the step profiler on: seconds per phase, host ("schedule", "plan", "launch", "codec", "frames",
    # "step_audio", "update"), device ("device_prefill", "device_decode", "device_codec", ...) and the host's
    # share of "launch" by the work it queued ("queue_prefill", "queue_decode", "queue_codec", ...), summed
    # over steps.
    phase_s: dict[str, float] = field(default_factory=dict)

    def record(self, step: StepObservation, execute_s: float = 0.0) -> None:
        """Add one step (`execute_s`: its time in the runner, where that is known)."""
        self.num_steps += 1
        self.num_decoded_frames += step.num_decodes
        self.num_prefills += step.num_prefills
        self.num_codec_frames += step.num_codec_frames
        self.num_eager_prefills += step.num_eager_prefills
        self.num_references_decoded += step.num_references_decoded
        self.num_references_kept += step.num_references_kept
        self.execute_s += execute_s
        self.loop_s += step.step_s
        self.last_step_s = step.step_s
        for phase, seconds in (step.phases or {}).items():
            self.phase_s[phase] = self.phase_s.get(phase, 0.0) + seconds


@dataclass(frozen=True)
class EngineOccupancy:
    """What the engine holds at one moment, as the scheduler counts it."""

    num_running: int
    num_waiting: int
    num_parked: int
    num_preemptions_total: int  # since start: requests that gave their KV back and will recompute it
    num_kv_blocks_used: int
    num_kv_blocks_total: int


# The runner's thread, which a stalled engine leaves stuck in its call (see `Engine.start`).
RUNNER_THREAD_NAME = "tts-runner"


class EngineStoppedError(RuntimeError):
    """The engine is not running, so it takes no requests."""


class EngineStalledError(RuntimeError):
    """A call into the runner made no progress within the stall bound: a stuck step (in-process engines only; an
    engine core's server watches the core from outside and kills it)."""


@dataclass
class _Live:
    """The engine's record of one request, from submit() until its stream has ended."""

    request: SynthesisRequest
    stream: RequestStream
    arrival_time: float
    text: IncrementalTokenizer | None = None  # open text only
    received_text: str = ""  # open text that needs the whole text before its prompt exists
    held_ids: list[int] = field(default_factory=list)  # committed, waiting for non-blank text
    prompt: Prompt | None = None  # None until the request is in the scheduler
    scheduled: Request | None = None  # the scheduler's record (its admission time), once added
    trailing: list[int] = field(default_factory=list)
    frames: list[np.ndarray] = field(default_factory=list)
    reference_codes: np.ndarray | None = None  # in-context clone: the codec's left context
    num_text_ids: int = 0  # tokens of the request's own text
    first_frame_time: float | None = None  # on the engine's clock, when the prefill produced frame 0
    first_audio_time: float | None = None  # on the engine's clock, when its first audio reached the stream
    # Its final codec chunk ran with audio still to hand out: the stream ends, so, once that audio is out.
    finish_after_audio: FinishReason | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id


@dataclass(frozen=True)
class _AudioOut:
    """A step's codec calls, still on the device, and the step they belong to."""

    output: SchedulerOutput
    audio: AudioInFlight


@dataclass(frozen=True)
class _StepInFlight:
    """A step whose frames are queued on the device and not yet collected, with the host seconds it took."""

    output: SchedulerOutput
    work: StepWork
    frames: PendingStep | Exception | None
    schedule_s: float
    plan_s: float
    launch_s: float


class Engine(StepObservers):
    """The one door below the API: submit, text, abort, clone a voice, stats, health.

    `runner` and `scheduler` are attributes for tests and benchmarks to inspect; the API uses only the
    methods (tests/test_layers.py holds it to that).
    """

    def __init__(self, model: LoadedModel, runner: ModelRunner, scheduler: Scheduler, prompts: PromptBuilder,
                 tokenization: TextTokenization, clock: Clock = time.monotonic,
                 max_unread_frames: int | None = None, voices: VoiceStore | None = None,
                 new_stream: Callable[[str], RequestStream] | None = None,
                 min_decodes_to_schedule_ahead: int | None = None, aligner: AlignerWorker | None = None,
                 max_segment_chars: int = EngineConfig.max_segment_chars,
                 max_segment_frames: int | None = None) -> None:
        super().__init__(clock)
        self.runner = runner
        self.min_decodes_to_schedule_ahead = min_decodes_to_schedule_ahead  # as EngineConfig's; None: never
        self.scheduler = scheduler
        self.prompts = prompts
        self.tokenization = tokenization
        self.model_info = ModelInfo.of(model, runner.kernel_paths, None if aligner is None else aligner.aligner.source)
        self._model = model
        self.max_unread_frames = max_unread_frames  # None: a reader may fall behind without limit
        # How a request's stream is made: by default one that its reader, in this process, iterates.
        self._new_stream = new_stream or self._local_stream
        config = model.config
        self._eos_code = config.talker.codec_eos_id
        self._tts_pad_id = config.tts_pad_token_id
        self._tts_eos_id = config.tts_eos_token_id
        self._num_groups = config.talker.num_code_groups
        self._live: dict[str, _Live] = {}
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=RUNNER_THREAD_NAME)
        # One cloning at a time: the encoders are heavy and share the device with the runner.
        self._clone_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tts-voice-clone")
        # One tokenization at a time: requests are queued in the order their text was tokenized.
        self._prompt_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tts-prompt")
        # Registered voices (None: the model cannot clone). The store reads the disk, so in its own thread, one
        # operation at a time: a count check and the write after it are one step.
        self._voices = voices
        self._voice_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tts-voice-store")
        self._aligner = aligner
        # Random weights never end speech themselves: their segments run to the time reading them takes, unguarded.
        bounds = None if model.is_random else functools.partial(
            SegmentBounds.for_text, frame_rate_hz=model.speech_config.frame_rate_hz,
            max_frames=max_segment_frames or 2**31)
        self._segmented = SegmentedRequests(max_segment_chars, SegmentDoor(
            self._submit_segment, self.abort, self.set_output_paused, self._segment_frames, bounds))
        self._streamed = StreamedSegmentedRequests(max_segment_chars, StreamedSegmentDoor(
            self._submit_streamed_segment, self._append_live_text, self._close_live_text, self._abort_live,
            self._pause_live, max_segment_frames or 2**31))
        self._max_segment_frames = max_segment_frames
        self._task: asyncio.Task[None] | None = None
        self._is_stopping = False
        self._stall_timeout_s: float | None = None
        self.is_stalled = False  # its runner thread is stuck in a call: it is never waited for again
        # On the engine's clock, when the runner's thread took up the call the loop now waits for; None between
        # calls. A call that never returns is a stuck step: the engine core reports this to the server's watchdog.
        self.runner_call_since: float | None = None
        self._audio_out: _AudioOut | None = None  # the last step's audio, handed out during the next step
        self.stats = EngineStats()

    @classmethod
    def create(cls, model: LoadedModel, config: EngineConfig, clock: Clock = time.monotonic,
               new_stream: Callable[[str], RequestStream] | None = None) -> Engine:
        """Load order: the aligner, if any (its weights are not the KV cache's to take), the runner (KV allocation,
        graph capture), then a scheduler sized from it."""
        aligner = None if config.aligner_model is None else AlignerWorker(load_aligner(config, model))
        frame_rate_hz = model.speech_config.frame_rate_hz
        runner = ModelRunner(model, config.runner_config(frame_rate_hz))
        logger.info("kernel paths: %s", runner.kernel_paths)
        prompts = PromptBuilder.for_tokenizer(model.config, model.tokenizer)
        tokenization = TextTokenization.for_tokenizer(model.tokenizer,
                                                      lambda text: prompts.assistant_token_ids(text)[1])
        scheduler = Scheduler(config.scheduler_config(runner.num_kv_blocks, frame_rate_hz))
        voices = None
        if model.speaker_encoder is not None:
            limits = VoiceLimits(config.max_voices, config.max_voice_bytes, config.max_voices_per_owner)
            voices = VoiceStore.open(config.voice_store_dir, limits, voice_shape(model))
        return cls(model, runner, scheduler, prompts, tokenization, clock, config.max_unread_frames(frame_rate_hz),
                   voices, new_stream, config.min_decodes_to_schedule_ahead, aligner, config.segment_chars,
                   math.ceil(config.max_audio_s * frame_rate_hz))

    @classmethod
    def load(cls, source: str, device: str, config: EngineConfig,
             new_stream: Callable[[str], RequestStream] | None = None) -> Engine:
        """Load exactly `source` (a directory, a repo id or random:<preset>) on `device` and create an engine for it.
        Raises CheckpointError when that model cannot be had: a server never serves another in its place."""
        options = LoadOptions.default_for(device, codec_decoder_dtype=config.codec_dtype,
                                          codec_convolution_dtype=config.codec_convolution_dtype)
        model = load_model(source, options, max_download_wait_s=config.model_download_timeout_s)
        if model.is_random:
            logger.warning("the model %s has RANDOM weights, as asked for: its audio is noise, not speech",
                           model.source)
        return cls.create(model, config, new_stream=new_stream)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, stall_timeout_s: float | None = None) -> None:
        """Start stepping. With `stall_timeout_s` (an engine in the server's own process, which nothing watches from
        outside), a runner call that lasts that long ends the engine: every thread's stack is written to stderr,
        the loop fails with EngineStalledError, and its live requests end with an error."""
        if self._task is not None:
            raise RuntimeError("the engine is already running")
        self._stall_timeout_s = stall_timeout_s
        self._task = asyncio.get_running_loop().create_task(self._run(), name="tts-engine")

    async def warm_up(self) -> bool:
        """One short synthesis through the running engine (see warm_up.py); False when the model has none."""
        return await warm_up(self)

    async def stop(self) -> None:
        """Stop stepping; requests still live end with an error. Drain first to finish them. A loop that failed
        has logged why (`join` raises it)."""
        self._is_stopping = True
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
            self._task = None
        await self._segmented.close()
        await self._streamed.close()
        self._executor.shutdown(wait=not self.is_stalled)
        self._clone_executor.shutdown(wait=False, cancel_futures=True)
        self._prompt_executor.shutdown(wait=False, cancel_futures=True)
        self._voice_executor.shutdown(wait=True)  # a voice being written is finished, never cut
        if self._aligner is not None:
            self._aligner.close()

    async def join(self) -> None:
        """Wait until the loop has ended: stopped, or failed (then its exception is raised here)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def wait_exited(self) -> None:
        """Return once the loop has ended, stopped or failed (it has logged why)."""
        with contextlib.suppress(Exception):
            await self.join()

    async def wait_cores_changed(self, num_running_seen: int) -> bool:
        """As EngineCores': one core's only change is its end, after which it never runs again."""
        await self.wait_exited()
        return False

    @property
    def is_running(self) -> bool:
        return self._task is not None and not self._task.done() and not self._is_stopping

    @property
    def num_cores_running(self) -> int:
        return int(self.is_running)

    @property
    def num_live_requests(self) -> int:
        return len(self._live)

    def num_unread_frames(self, request_id: str) -> int:
        """Frames of audio handed to the request's stream and not yet taken by its reader (0 once it ended)."""
        live = self._live.get(request_id)
        return live.stream.num_unread_frames if live is not None else 0

    def occupancy(self) -> EngineOccupancy:
        """What the engine holds now, as the scheduler counts it."""
        scheduler = self.scheduler
        return EngineOccupancy(num_running=scheduler.num_running, num_waiting=scheduler.num_waiting,
                          num_parked=scheduler.num_parked, num_preemptions_total=scheduler.num_preemptions_total,
                          num_kv_blocks_used=scheduler.num_kv_blocks_used,
                          num_kv_blocks_total=scheduler.num_kv_blocks_total)

    def captured_graph_batch_sizes(self) -> dict[str, list[int]]:
        """The batch sizes captured as CUDA graphs, by kind of step (empty without graphs)."""
        return self.runner.captured_graph_batch_sizes()

    # -- calls from the server ----------------------------------------------------------------

    async def submit(self, request: SynthesisRequest) -> RequestStream:
        """Queue a request. Raises PromptError for input the model cannot serve, and the scheduler's
        QueueFullError / RequestTooLargeError when there is no room; nothing is queued then.

        A whole text is tokenized in a worker thread, so that a long one never stalls the event loop; one longer
        than a segment is spoken segment by segment (segmented.py), as one request to its caller, and so is
        streamed text once it runs past a segment (streamed_segments.py)."""
        if request.is_text_open:
            self._check_submittable(request)
            return await self._streamed.submit(request, self._new_stream(request.request_id))
        if self._segmented.is_segmented(request):
            self._check_submittable(request)
            return await self._segmented.submit(request, self._new_stream(request.request_id))
        return await self._submit_one(request, self._new_stream)

    async def _submit_segment(self, request: SynthesisRequest) -> RequestStream:
        """One segment of a segmented request: its stream is read in this process, by the request's run."""
        return await self._submit_one(request, self._local_stream)

    async def _submit_streamed_segment(self, request: SynthesisRequest, into: RequestStream,
                                       frame_offset: int) -> RequestStream:
        """One segment of a request with streamed text: its audio goes on into the request's stream."""
        return await self._submit_one(request, lambda segment_id: SegmentOutput(segment_id, into, frame_offset))

    async def _submit_one(self, request: SynthesisRequest,
                          new_stream: Callable[[str], RequestStream]) -> RequestStream:
        arrival_time = self.clock()
        self._check_submittable(request)
        if request.is_text_open:
            self.prompts.validate(request.synthesis, is_text_required=False)
            live = _Live(request, new_stream(request.request_id), arrival_time)
            live.text = IncrementalTokenizer(self.tokenization)
        else:
            self.prompts.validate(request.synthesis)
            prompt, num_text_ids = await asyncio.get_running_loop().run_in_executor(
                self._prompt_executor, self._build_prompt, request.synthesis)
            self._check_submittable(request)  # the engine may have stopped, or the id been taken, meanwhile
            live = _Live(request, new_stream(request.request_id), arrival_time)
            self._enter(live, prompt, is_text_closed=True)
            live.num_text_ids = num_text_ids
        self._live[request.request_id] = live
        self._wake.set()
        return live.stream

    def _check_submittable(self, request: SynthesisRequest) -> None:
        if not self.is_running:
            raise EngineStoppedError("the engine is not running")
        if (request.request_id in self._live or self._segmented.owns(request.request_id)
                or self._streamed.owns(request.request_id)):
            raise ValueError(f"request id {request.request_id!r} is already in use")

    def _local_stream(self, request_id: str) -> RequestStream:
        return RequestStream(request_id, self.max_unread_frames,
                             lambda is_backlogged: self.set_output_paused(request_id, is_backlogged))

    def _build_prompt(self, synthesis: SynthesisInput) -> tuple[Prompt, int]:
        """The prompt and the number of the text's own tokens (off the event loop)."""
        return self.prompts.build(synthesis), len(self.prompts.assistant_token_ids(synthesis.text)[1])

    def append_text(self, request_id: str, fragment: str) -> None:
        """More text for an open request. Unknown or finished ids are ignored (the stream has ended)."""
        if self._streamed.owns(request_id):
            self._streamed.append_text(request_id, fragment)
        else:
            self._append_live_text(request_id, fragment)

    def close_text(self, request_id: str) -> None:
        """The open request's text is complete."""
        if self._streamed.owns(request_id):
            self._streamed.close_text(request_id)
        else:
            self._close_live_text(request_id)

    def _append_live_text(self, request_id: str, fragment: str) -> None:
        live = self._live.get(request_id)
        if live is None or not fragment:
            return
        if live.text is None or live.text.is_closed:
            raise ValueError(f"request {request_id!r} takes no more text")
        live.received_text += fragment
        self._add_text_ids(live, live.text.append(fragment), is_closed=False)

    def _close_live_text(self, request_id: str) -> None:
        live = self._live.get(request_id)
        if live is None or live.text is None or live.text.is_closed:
            return
        self._add_text_ids(live, live.text.close(), is_closed=True)

    async def clone_voice(self, wav_24k: np.ndarray, reference_text: str | None,
                          x_vector_only: bool) -> VoiceClone:
        """A voice for SynthesisInput.clone from 24 kHz mono reference audio, computed off the event loop.

        Raises PromptError when the model cannot clone (a model without a speaker encoder, or in-context
        cloning without the codec encoder)."""
        return await asyncio.get_running_loop().run_in_executor(
            self._clone_executor, clone_voice, self._model, wav_24k, reference_text, x_vector_only)

    async def create_voice(self, wav_24k: np.ndarray, reference_text: str | None, x_vector_only: bool,
                           owner: str) -> RegisteredVoice:
        """Clone a voice and store it for `owner`. Raises PromptError as clone_voice does, and VoiceStoreFullError
        past the store's limits (checked before the cloning too, so that a full store costs no encoding)."""
        voices = self._voices
        if voices is None:
            raise PromptError("reference_audio", f"the loaded {self.model_info.model_type} model cannot clone "
                                                 "voices; registered voices need a Base checkpoint")
        await self._in_voice_store(voices.check_room, owner)
        clone = await self.clone_voice(wav_24k, reference_text, x_vector_only)
        reference_seconds = len(wav_24k) / self.model_info.sample_rate
        return await self._in_voice_store(voices.create, clone, reference_seconds, owner)

    async def registered_voice(self, voice_id: str, owner: str) -> RegisteredVoice:
        """The owner's voice `voice_id`; VoiceNotFoundError when it has none by that id."""
        if self._voices is None:
            raise VoiceNotFoundError(voice_id)
        return await self._in_voice_store(self._voices.get, voice_id, owner)

    async def registered_voices(self, owner: str) -> list[RegisteredVoice]:
        """The owner's voices, oldest first."""
        if self._voices is None:
            return []
        return await self._in_voice_store(self._voices.owned_by, owner)

    async def delete_voice(self, voice_id: str, owner: str) -> None:
        if self._voices is None:
            raise VoiceNotFoundError(voice_id)
        await self._in_voice_store(self._voices.delete, voice_id, owner)

    async def align_words(self, item: AlignmentItem) -> list[WordTiming]:
        """When the clip speaks each word of its text, from the aligner loaded beside the model, batched with the
        other requests' windows. Raises PromptError when none is loaded."""
        if self._aligner is None:
            raise PromptError("word_timestamps", "this engine has no forced aligner (--aligner-model)")
        return await self._aligner.align(item)

    def _segment_frames(self, text: str) -> int:
        """The most frames one segment of this text may take: the audio limit of one generation, or, with random
        weights (which never end speech by themselves), about the time reading it aloud takes."""
        limit = self._max_segment_frames or 2**31
        seconds = self.model_info.default_audio_seconds(text, limit / self.model_info.frame_rate_hz)
        return max(1, min(limit, round(seconds * self.model_info.frame_rate_hz)))

    async def _in_voice_store(self, operation: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._voice_executor, operation, *args)

    def abort(self, request_id: str) -> None:
        if self._segmented.owns(request_id):
            self._segmented.abort(request_id)
        elif self._streamed.owns(request_id):
            self._streamed.abort(request_id)
        else:
            self._abort_live(request_id)

    def _abort_live(self, request_id: str) -> None:
        live = self._live.get(request_id)
        if live is None:
            return
        if live.prompt is None:  # never reached the scheduler
            self._end(live, FinishReason.ABORTED)
            return
        self.scheduler.abort(request_id)
        self._wake.set()

    def set_output_paused(self, request_id: str, is_paused: bool) -> None:
        """The request's reader fell behind (pause it) or caught up (resume it)."""
        if self._segmented.owns(request_id):
            self._segmented.set_output_paused(request_id, is_paused)
        elif self._streamed.owns(request_id):
            self._streamed.set_output_paused(request_id, is_paused)
        else:
            self._pause_live(request_id, is_paused)

    def _pause_live(self, request_id: str, is_paused: bool) -> None:
        self.scheduler.set_output_paused(request_id, is_paused)
        self._wake.set()

    # -- text ---------------------------------------------------------------------------------

    def _add_text_ids(self, live: _Live, ids: list[int], is_closed: bool) -> None:
        live.num_text_ids += len(ids)
        if live.prompt is not None:
            live.trailing += ids
            if is_closed:
                live.trailing.append(self._tts_eos_id)
            self.scheduler.append_text(live.request_id, len(ids) + int(is_closed), is_closed)
            self._wake.set()
            return
        synthesis = live.request.synthesis
        try:
            if not self.prompts.can_stream_text(synthesis):
                if is_closed:
                    self._enter(live, self.prompts.build(replace(synthesis, text=live.received_text)), True)
                return
            live.held_ids += ids
            if not live.received_text.strip():
                if is_closed:
                    raise PromptError("text", "must not be empty")
                return
            if live.held_ids:
                prompt = self.prompts.build_open(synthesis, live.held_ids)
                if is_closed:
                    prompt = replace(prompt, trailing_text_ids=(*prompt.trailing_text_ids, self._tts_eos_id))
                self._enter(live, prompt, is_closed)
        except Exception as error:  # the request fails; its stream says why
            self._live.pop(live.request_id, None)
            live.stream.fail(error)

    def _enter(self, live: _Live, prompt: Prompt, is_text_closed: bool) -> None:
        """Hand a request with a complete prompt to the scheduler."""
        request = live.request
        live.prompt = prompt
        live.trailing = list(prompt.trailing_text_ids)
        clone = request.synthesis.clone
        if clone is not None and clone.reference_codes:
            live.reference_codes = np.asarray(clone.reference_codes, dtype=np.int64)
        now = self.clock()
        if request.is_text_open:
            live.arrival_time = now  # queue time counts from the moment the request could run
        scheduled = Request(request.request_id, prompt.num_positions, request.params.max_new_frames,
                            arrival_time=now, deadline=request.deadline,
                            num_text_tokens=len(live.trailing), is_text_closed=is_text_closed)
        self.scheduler.add(scheduled)
        live.scheduled = scheduled
        self._wake.set()

    def _text_id_for_input(self, live: _Live, frame_index: int) -> int:
        """The trailing text token added to frame `frame_index` when it is fed back to the talker."""
        return live.trailing[frame_index] if frame_index < len(live.trailing) else self._tts_pad_id

    # -- the loop -----------------------------------------------------------------------------

    async def _run(self) -> None:
        in_flight: _StepInFlight | None = None
        try:
            while not self._is_stopping:
                self._wake.clear()
                if in_flight is None:
                    in_flight = await self._step_in_order()
                else:
                    in_flight = await self._step_with_one_in_flight(in_flight)
        except Exception:
            logger.exception("the engine loop failed; every live request ends with an error")
            raise
        finally:
            for live in list(self._live.values()):
                self._end(live, FinishReason.ERROR, error="the engine stopped")

    async def _step_in_order(self) -> _StepInFlight | None:
        """Schedule a step with none in flight. Run it whole, or, where the next may be scheduled ahead of it,
        only queue its frames and return it in flight."""
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        output = self.scheduler.schedule(self.clock())
        self._release(output.freed)
        if output.is_empty:
            if self._audio_out is not None:
                await self._hand_out_last_audio()
            else:
                await self._sleep_until_work()
            return None
        scheduled = time.perf_counter()
        work = self._plan(output)
        planned = time.perf_counter()
        if self._may_schedule_after(work):
            frames = await self._in_runner(start_frames, self.runner, work)
            return _StepInFlight(output, work, frames, scheduled - started, planned - scheduled,
                                 time.perf_counter() - planned)
        done = await self._in_runner(run_step, self.runner, work, self._hand_out_previous(loop))
        self._answer(output, done, started, scheduled - started, planned - scheduled, planned)
        return None

    async def _step_with_one_in_flight(self, step: _StepInFlight) -> _StepInFlight | None:
        """Schedule the next step ahead of `step` where the scheduler takes it, queue its frames behind `step`'s,
        then collect `step` and answer it. Returns the next step, now in flight."""
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        output = self.scheduler.schedule_ahead(self.clock()) if self._may_schedule_after(step.work) else None
        if output is not None:
            self._release(output.freed)
        scheduled = time.perf_counter()
        work = None if output is None or output.is_empty else self._plan(output)
        planned = time.perf_counter()
        done, frames = await self._in_runner(finish_step, self.runner, step.work, step.frames,
                                             self._hand_out_previous(loop), work)
        launch_s, done.launch_s = done.launch_s, step.launch_s
        self._answer(step.output, done, started, step.schedule_s, step.plan_s, planned)
        if output is None or work is None:
            return None
        self.stats.num_steps_ahead += 1
        return _StepInFlight(output, work, frames, scheduled - started, planned - scheduled, launch_s)

    def _may_schedule_after(self, work: StepWork) -> bool:
        """Whether the step after `work` may be scheduled ahead, while `work` runs."""
        minimum = self.min_decodes_to_schedule_ahead
        return minimum is not None and len(work.decode_ids) >= minimum and has_all_audio_queued(work)

    def _hand_out_previous(self, loop: asyncio.AbstractEventLoop) -> Callable[[], None] | None:
        """The last step's audio, to be handed out by the runner's thread during the next call there."""
        previous, self._audio_out = self._audio_out, None
        return None if previous is None else functools.partial(self._hand_out_from_runner, loop, previous)

    def _answer(self, output: SchedulerOutput, done: StepDone, started: float, schedule_s: float, plan_s: float,
                executed: float) -> None:
        """Apply a collected step, keep its audio in flight for the next step to hand out, and count it
        (`started`, `executed`: when the loop took it up, and when the runner's call for it began)."""
        computed = time.perf_counter()
        self._apply(output, done)  # the previous step's audio was queued on the loop first, so it is out by now
        if done.audio_in_flight is not None and done.audio_in_flight.calls:
            self._audio_out = _AudioOut(output, done.audio_in_flight)
        applied = time.perf_counter()
        phases = None
        if self.runner.timer is not None:  # the step profiler: host phases, then the device's
            phases = {"schedule": schedule_s, "plan": plan_s, "launch": done.launch_s, "codec": done.codec_s,
                      "frames": done.frames_s, "step_audio": done.step_audio_s, "update": applied - computed}
            times = self.runner.timer.take()
            phases |= {f"device_{name}": seconds for name, seconds in times.device.items()}
            phases |= {f"queue_{name}": seconds for name, seconds in times.host.items()}
        self._count(output, computed - executed, applied - started, phases)

    def _hand_out_from_runner(self, loop: asyncio.AbstractEventLoop, step: _AudioOut) -> None:
        """On the runner's thread: wait for the step's samples, then hand them out on the loop."""
        loop.call_soon_threadsafe(self._deliver_audio, step, step.audio.collect())

    async def _hand_out_last_audio(self) -> None:
        """With no step to run, the last step's audio is collected on its own."""
        last, self._audio_out = self._audio_out, None
        assert last is not None
        done = await self._in_runner(last.audio.collect)
        self._deliver_audio(last, done)

    def _count(self, output: SchedulerOutput, execute_s: float, loop_s: float,
               phases: dict[str, float] | None) -> None:
        # The runner's thread is idle between steps, so its counts are read here without a race.
        runner, stats = self.runner, self.stats
        step = StepObservation(num_decodes=len(output.decodes), num_prefills=len(output.prefills),
                               num_codec_frames=sum(chunk.num_frames for chunk in output.codec_chunks), step_s=loop_s,
                               phases=phases, num_eager_prefills=runner.num_eager_prefills - stats.num_eager_prefills,
                               num_references_decoded=runner.primed_voices.num_misses - stats.num_references_decoded,
                               num_references_kept=runner.primed_voices.num_hits - stats.num_references_kept)
        self.stats.record(step, execute_s)
        for observer in self._step_observers:
            observer(step)

    async def _in_runner(self, function: Callable[..., T], *args: object) -> T:
        self.runner_call_since = self.clock()
        try:
            call = asyncio.get_running_loop().run_in_executor(self._executor, function, *args)
            if self._stall_timeout_s is None:
                return await call
            try:
                return await asyncio.wait_for(call, self._stall_timeout_s)
            except TimeoutError:
                self.is_stalled = True
                logger.error("a step made no progress for %g s (--engine-stall-timeout-seconds); every thread's "
                             "stack follows", self._stall_timeout_s)
                # Written without the GIL a stuck thread may hold; it names the call the runner is stuck in.
                faulthandler.dump_traceback(all_threads=True)
                raise EngineStalledError(f"a step made no progress for {self._stall_timeout_s:g} s") from None
        finally:
            self.runner_call_since = None

    async def _sleep_until_work(self) -> None:
        deadline = self.scheduler.next_deadline()
        timeout = None if deadline is None else max(0.0, deadline - self.clock())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    def _plan(self, output: SchedulerOutput) -> StepWork:
        prefills, restarts = [], []
        for item in output.prefills:
            live = self._live[item.request_id]
            assert live.prompt is not None
            frames = live.frames[:item.num_resumed_frames]
            clone = live.request.synthesis.clone
            prefills.append(PrefillInput(
                item.slot, item.block_ids, live.prompt, live.request.params,
                speaker_embedding=clone.speaker_embedding if clone is not None else None,  # type: ignore[arg-type]
                resumed_frames=tuple(tuple(int(c) for c in frame) for frame in frames),
                resumed_text_ids=tuple(self._text_id_for_input(live, index) for index in range(len(frames)))))
            restarts.append(AudioRestart(item.slot, self._codec_context(live, item.num_codec_frames),
                                         is_voice_reference=live.reference_codes is not None
                                         and item.num_codec_frames == 0))
        decodes = []
        for item in output.decodes:
            live = self._live[item.request_id]
            decodes.append(DecodeInput(item.slot, item.block_ids, item.position, item.frame_index,
                                       self._text_id_for_input(live, item.frame_index - 1)))
        chunks = tuple(self._codec_work(chunk) for chunk in output.codec_chunks if not chunk.is_step_frame)
        with_older_audio = {chunk.request_id for chunk in chunks}
        step_frames = tuple(self._step_frame_work(chunk, chunk.request_id not in with_older_audio)
                            for chunk in output.codec_chunks if chunk.is_step_frame)
        audio_slots = frozenset(item.slot for item in step_frames if item.is_decoded_in_step)
        return StepWork(StepInput(tuple(prefills), tuple(decodes), audio_slots, tuple(restarts)),
                        prefill_ids=tuple(item.request_id for item in output.prefills),
                        decode_ids=tuple(item.request_id for item in output.decodes),
                        chunks=chunks, step_frames=step_frames,
                        eos_code=self._eos_code)

    def _codec_context(self, live: _Live, num_codec_frames: int) -> np.ndarray:
        frames = self._stack_frames(live.frames[:num_codec_frames])
        return frames if live.reference_codes is None else np.concatenate([live.reference_codes, frames])

    def _stack_frames(self, frames: list[np.ndarray]) -> np.ndarray:
        """Frames [G] each -> [T, G] int64, also when there are none."""
        return np.stack(frames) if frames else np.zeros((0, self._num_groups), dtype=np.int64)

    def _codec_work(self, chunk: CodecChunk) -> CodecWork:
        live = self._live[chunk.request_id]
        frames = live.frames[chunk.first_frame:chunk.first_frame + chunk.num_frames]
        # One frame is every running stream's chunk every step: a view of it, where np.stack would copy.
        codes = frames[0][np.newaxis] if len(frames) == 1 else self._stack_frames(frames)
        return CodecWork(chunk.request_id, chunk.slot, chunk.first_frame, codes)

    def _step_frame_work(self, chunk: CodecChunk, is_stream_caught_up: bool) -> StepFrameWork:
        """`is_stream_caught_up`: no older chunk of the stream is decoded this step. Then a chunk of the step's frame
        alone is decoded on the device right behind it, before the frame reaches the host."""
        live = self._live[chunk.request_id]
        earlier = tuple(live.frames[chunk.first_frame:chunk.first_frame + chunk.num_frames - 1])
        return StepFrameWork(chunk.request_id, chunk.slot, chunk.first_frame, earlier,
                             is_decoded_in_step=is_stream_caught_up and not earlier)

    def _apply(self, output: SchedulerOutput, done: StepDone) -> None:
        eos_ids = {request_id for request_id, frame in done.frames.items() if frame[0] == self._eos_code}
        result = StepResult.for_output(output, eos_ids, done.errors)
        now = self.clock()
        events = self.scheduler.update(result, now)
        for event in events:
            self._apply_event(event, done, now)
        in_flight = done.audio_in_flight
        queued_ids = set() if in_flight is None else {chunk.request_id for group, _ in in_flight.calls
                                                       for chunk in group if chunk is not None}
        for chunk in output.codec_chunks:
            live = self._live.get(chunk.request_id)
            if live is None or not chunk.is_final:
                continue
            request = self.scheduler.requests[chunk.request_id]
            assert request.finish_reason is not None
            if chunk.request_id in queued_ids:
                live.finish_after_audio = request.finish_reason
            else:
                self._end(live, request.finish_reason)

    def _deliver_audio(self, step: _AudioOut, done: StepDone) -> None:
        """Hand a step's decoded chunks to their streams, then end the streams whose last audio that was."""
        now = self.clock()
        for chunk in step.output.codec_chunks:
            live = self._live.get(chunk.request_id)
            samples = done.audio.get((chunk.request_id, chunk.first_frame))
            # A chunk past the stream's last frame decoded a frame made after its end, scheduled ahead while
            # the frame that ended it was in flight: nobody hears it.
            if live is None or samples is None or chunk.first_frame + chunk.num_frames > len(live.frames):
                continue
            live.stream.put_audio(AudioChunk(samples, chunk.first_frame, chunk.num_frames))
            if live.first_audio_time is None:
                live.first_audio_time = now
        for request_id, error in done.errors.items():  # the device failed the call: its requests fail
            live = self._live.get(request_id)
            if live is not None:
                self.scheduler.abort(request_id, FinishReason.ERROR)
                self._end(live, FinishReason.ERROR, error=error)
        for chunk in step.output.codec_chunks:
            live = self._live.get(chunk.request_id)
            if live is not None and chunk.is_final and live.finish_after_audio is not None:
                self._end(live, live.finish_after_audio)

    def _apply_event(self, event: RequestEvent, done: StepDone, now: float) -> None:
        live = self._live.get(event.request_id)
        if live is None:
            return
        if event.is_new_frame:
            if live.first_frame_time is None:
                live.first_frame_time = now
            live.frames.append(done.frames[event.request_id])
        if event.finish_reason is FinishReason.ERROR:
            self._end(live, FinishReason.ERROR, error=event.error)

    def _release(self, freed: tuple[FreedItem, ...]) -> None:
        for item in freed:
            live = self._live.get(item.request_id)
            if live is not None and item.reason in (FinishReason.ABORTED, FinishReason.ERROR):
                self._end(live, item.reason, error="request failed" if item.reason is FinishReason.ERROR else None)

    def _end(self, live: _Live, reason: FinishReason, error: str | None = None) -> None:
        if self._live.pop(live.request_id, None) is None:
            return
        scheduled = live.scheduled
        timeline = RequestTimeline(
            arrival=live.arrival_time, admitted=None if scheduled is None else scheduled.admitted_time,
            first_frame=live.first_frame_time, first_audio=live.first_audio_time,
            finished=self.clock())
        live.stream.finish(SynthesisSummary(
            request_id=live.request_id, finish_reason=reason, num_frames=len(live.frames),
            num_text_tokens=live.num_text_ids, codes=self._stack_frames(live.frames), timeline=timeline,
            error=error))
