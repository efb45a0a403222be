"""One engine step as plain data, and its execution on the runner (off the event loop).

The engine turns a SchedulerOutput into a StepWork on the event loop (where the per-request
data lives), a worker thread runs it against the runner, and the StepDone comes back. Nothing
here touches the scheduler or the request streams.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tts_service.runner.runner import HostCopy, ModelRunner, PendingStep, StepInput, StepOutput

logger = logging.getLogger(__name__)

# What a stream whose audio came out NaN or infinite is told. The codec clamps its waveform, so only a NaN gets
# this far, and the likeliest one is an fp16 convolution that overflowed: its state is poisoned, its audio lost.
NON_FINITE_AUDIO = "audio decoding produced non-finite samples"


@dataclass(frozen=True)
class CodecWork:
    """Frames of one request's audio stream to decode, in stream order."""

    request_id: str
    slot: int
    first_frame: int
    codes: np.ndarray  # [T, G] int64; T may be 0 for a final chunk with nothing left


@dataclass(frozen=True)
class StepFrameWork:
    """A chunk that ends with the frame this step makes: decoded once that frame exists, unless it is EOS."""

    request_id: str
    slot: int
    first_frame: int
    earlier_frames: tuple[np.ndarray, ...]  # [G] int64 each: the chunk's frames made in earlier steps, often none
    # Decoded by the runner on the device right behind the frames (the slot is in `StepInput.audio_slots`), not
    # after they reach the host: the chunk is that frame alone, and nothing older of the stream is left to decode.
    is_decoded_in_step: bool = False


@dataclass(frozen=True)
class StepWork:
    step: StepInput
    prefill_ids: tuple[str, ...]  # request ids of step.prefills, in order
    decode_ids: tuple[str, ...]
    chunks: tuple[CodecWork, ...]  # of frames made in earlier steps; a request's come before its step frame
    step_frames: tuple[StepFrameWork, ...] = ()
    eos_code: int = -1  # codebook 0's end of speech: such a frame has no audio


@dataclass
class StepDone:
    frames: dict[str, np.ndarray] = field(default_factory=dict)  # request id -> [G] codes
    audio: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)  # (request id, first frame) -> samples
    errors: dict[str, str] = field(default_factory=dict)
    # The step's codec calls, queued by the frame step or once its frames are back: the next step (or the loop,
    # when idle) collects them.
    audio_in_flight: AudioInFlight | None = None
    # Host seconds queueing the frames (building their inputs), the codec restarts and the audio decoded with them:
    # this step's, or with a step scheduled ahead, the next step's.
    launch_s: float = 0.0
    codec_s: float = 0.0  # host seconds then waiting for the previous step's samples and handing them over
    frames_s: float = 0.0  # host seconds then waiting for the frames
    step_audio_s: float = 0.0  # host seconds then queueing the step's codec calls


def run_step(runner: ModelRunner, work: StepWork, hand_out_previous: Callable[[], None] | None) -> StepDone:
    """The whole step on the runner's thread, nothing in it waiting for the event loop.

    The frames are queued first, beside the previous step's codec calls (the codec has a stream of its own), then
    the new streams' codec restarts, and the audio of each stream's newest frame where that frame alone is its
    chunk. While they run, `hand_out_previous` waits for the previous step's samples and hands them out. Then,
    once the frames are back, the step's other chunks are queued, and all are left running: the loop updates the
    scheduler and plans the next step while the device decodes.
    """
    started = time.perf_counter()
    frames = start_frames(runner, work)
    launch_s = time.perf_counter() - started
    done, _ = finish_step(runner, work, frames, hand_out_previous)
    done.launch_s = launch_s
    return done


def finish_step(runner: ModelRunner, work: StepWork, frames: PendingStep | Exception | None,
                hand_out_previous: Callable[[], None] | None, next_work: StepWork | None = None
                ) -> tuple[StepDone, PendingStep | Exception | None]:
    """The rest of a step whose frames `start_frames` queued: with `next_work` (a step scheduled ahead), its
    frames are queued first, behind this step's on the device, so that the device goes from one step's frames
    to the next without waiting for the host; then as `run_step`. Returns the step's result and the next step's
    frames in flight (None without a next step)."""
    started = time.perf_counter()
    done = StepDone()
    next_frames = start_frames(runner, next_work) if next_work is not None else None
    launched = time.perf_counter()
    if hand_out_previous is not None:
        hand_out_previous()
    audio_done = time.perf_counter()
    collect_frames(work, frames, done)
    frames_done = time.perf_counter()
    done.audio_in_flight = start_step_audio(runner, work, done, frames)
    done.launch_s, done.codec_s, done.frames_s = launched - started, audio_done - launched, frames_done - audio_done
    done.step_audio_s = time.perf_counter() - frames_done
    return done, next_frames


def has_all_audio_queued(work: StepWork) -> bool:
    """Whether all of the step's codec work was queued with its frames (each chunk is the step's own frame
    alone, decoded on the device right behind it, or a final chunk with nothing left to decode), so that nothing
    of it is left to queue once the frames are back: only then may the next step's frames, and its codec
    restarts, be queued before this step's are collected."""
    return (all(chunk.codes.shape[0] == 0 for chunk in work.chunks)
            and all(item.is_decoded_in_step for item in work.step_frames))


@dataclass
class AudioInFlight:
    """Codec calls queued on the device, by the chunks each decodes; `collect()` waits for their samples."""

    # None in a group: a row decoded with the others whose audio nobody gets (its frame was EOS, its request failed).
    calls: list[tuple[list[CodecWork | None], HostCopy]] = field(default_factory=list)

    def collect(self) -> StepDone:
        """The samples by (request id, first frame); a call that failed on the device is charged to its chunks, and
        a chunk whose samples are not all finite to its own request (a listener must never get NaNs)."""
        done = StepDone()
        for group, pending in self.calls:
            chunks = [chunk for chunk in group if chunk is not None]
            try:
                samples = pending.result()
            except Exception as error:
                logger.exception("audio decoding failed for %d requests", len(chunks))
                for chunk in chunks:
                    done.errors[chunk.request_id] = f"audio decoding failed: {error}"
                continue
            num_non_finite = 0
            for chunk, row in zip(group, samples, strict=True):
                if chunk is None:
                    continue
                if np.isfinite(row).all():
                    done.audio[(chunk.request_id, chunk.first_frame)] = row
                else:
                    done.errors[chunk.request_id] = NON_FINITE_AUDIO
                    num_non_finite += 1
            if num_non_finite:
                logger.error("%s for %d of %d requests; with fp16 convolutions in the codec (the default on CUDA) "
                             "that is an overflow, which --codec-convolution-dtype float32 avoids", NON_FINITE_AUDIO,
                             num_non_finite, len(chunks))
        self.calls.clear()
        return done


def start_step_audio(runner: ModelRunner, work: StepWork, done: StepDone,
                     frames: PendingStep | Exception | None) -> AudioInFlight:
    """The step's codec work: what the frame step already queued, then the chunks of earlier frames and those
    ending with a frame this step made, queued now (skipped when that frame is EOS or its request failed). What
    fails to queue goes into `done.errors`."""
    audio = AudioInFlight()
    if isinstance(frames, PendingStep) and frames.audio is not None:
        in_step = {item.slot: item for item in work.step_frames if item.is_decoded_in_step}
        group = [_step_frame_chunk(in_step[slot], done, work.eos_code) for slot in frames.audio_slots]
        audio.calls.append((group, frames.audio))
    step_chunks = [chunk for item in work.step_frames if not item.is_decoded_in_step
                   if (chunk := _step_frame_chunk(item, done, work.eos_code)) is not None]
    _start_chunks(runner, (*work.chunks, *step_chunks), audio, done.errors)
    return audio


def _step_frame_chunk(item: StepFrameWork, done: StepDone, eos_code: int) -> CodecWork | None:
    """The chunk `item` stands for, now that its frame is made; None when it has no audio to give (the frame is
    EOS, or the request failed)."""
    frame = done.frames.get(item.request_id)
    if frame is None or item.request_id in done.errors or frame[0] == eos_code:
        return None
    codes = np.stack((*item.earlier_frames, frame)) if item.earlier_frames else frame[np.newaxis]
    return CodecWork(item.request_id, item.slot, item.first_frame, codes)


def start_frames(runner: ModelRunner, work: StepWork) -> PendingStep | Exception | None:
    """Queue the step's prefills and decodes; what queueing raised, for `collect_frames`; None when there are none."""
    if not (work.step.prefills or work.step.decodes):
        return None
    try:
        return runner.start_step(work.step)
    except Exception as error:
        return error


def collect_frames(work: StepWork, frames: PendingStep | Exception | None, done: StepDone) -> None:
    """The frames of `start_frames`, added to `done`; a failure is charged to its requests, never raised."""
    if frames is None:
        return
    try:
        if isinstance(frames, Exception):
            raise frames
        _collect_frames(work, frames.result(), done)
        _charge_failed_restarts(work, frames.failed_restarts, done)
    except Exception as error:  # a failed batch fails its requests, not the engine
        logger.exception("frame step failed for %d requests", len(work.prefill_ids) + len(work.decode_ids))
        for request_id in (*work.prefill_ids, *work.decode_ids):
            done.errors.setdefault(request_id, f"frame step failed: {error}")


def _charge_failed_restarts(work: StepWork, failed: dict[int, str], done: StepDone) -> None:
    """A stream whose context failed to decode fails its request alone (the step's restarts are its prefills)."""
    for item, request_id in zip(work.step.prefills, work.prefill_ids, strict=True):
        if item.slot in failed:
            logger.error("codec context failed for %s: %s", request_id, failed[item.slot])
            done.errors[request_id] = f"audio decoding failed: {failed[item.slot]}"


def _collect_frames(work: StepWork, output: StepOutput, done: StepDone) -> None:
    for index, error in output.failed_prefills.items():
        request_id = work.prefill_ids[index]
        logger.error("prefill input failed for %s: %s", request_id, error)
        done.errors[request_id] = f"prefill failed: {error}"
    prefill_ids = [request_id for index, request_id in enumerate(work.prefill_ids)
                   if index not in output.failed_prefills]
    for ids, frames in ((prefill_ids, output.prefill_frames), (work.decode_ids, output.decode_frames)):
        for request_id, frame in zip(ids, frames, strict=True):
            done.frames[request_id] = frame


def _start_chunks(runner: ModelRunner, chunks: tuple[CodecWork, ...], audio: AudioInFlight,
                  errors: dict[str, str]) -> None:
    """Batch chunks of equal length across requests; a request's own chunks stay in order. A request in
    `errors` is left out, and one whose call fails to queue is added to it."""
    rounds: defaultdict[int, defaultdict[int, list[CodecWork]]] = defaultdict(lambda: defaultdict(list))
    seen: Counter[str] = Counter()
    for chunk in chunks:
        rounds[seen[chunk.request_id]][chunk.codes.shape[0]].append(chunk)
        seen[chunk.request_id] += 1
    for index in sorted(rounds):
        for num_frames, group in rounds[index].items():
            group = [chunk for chunk in group if chunk.request_id not in errors]
            if num_frames == 0 or not group:
                continue
            try:
                pending = runner.start_audio([chunk.slot for chunk in group],
                                             np.stack([chunk.codes for chunk in group]))
            except Exception as error:
                logger.exception("audio decoding failed for %d requests", len(group))
                for chunk in group:
                    errors[chunk.request_id] = f"audio decoding failed: {error}"
                continue
            audio.calls.append((group, pending))
