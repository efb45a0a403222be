"""The model runner: owns the device, the paged talker KV memory, per-slot state and CUDA graphs.

Start-up reads: load weights -> allocate slot state and KV blocks -> capture graphs per batch bucket.
A step is `execute(StepInput) -> StepOutput`: the talker decodes one position for every running request,
the talker prefills the new requests (batched), then one frame sampling pass (codebook 0 and the code
predictor's 15 codebooks) serves both, the prefills' first frames in the rows after the decodes', and every
produced frame goes to the host in one transfer. The codec, on a CUDA stream of its own, decodes the frames
of the step's audio slots right behind them, reading them on the device. Sampling a new request's first
frame with the running ones, instead of in a predictor pass of its own, is what keeps an admission
from costing the running streams a whole extra predictor pass.
"""

from __future__ import annotations

import bisect
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from tts_service.model.checkpoint import LoadedModel
from tts_service.model.codec_decoder import CodecStreamState
from tts_service.model.embedding import PromptIds, embed_prompt_ids, embed_text_ids, prompt_ids
from tts_service.model.kernel_policy import KernelPolicy
from tts_service.model.layers import use_fused_kernels
from tts_service.model.prompts import Prompt
from tts_service.runner.config import RunnerConfig
from tts_service.runner.frame_step import (
    FrameSampler,
    SlotState,
    predictor_call,
    predictor_memory,
    queued_upload,
)
from tts_service.runner.kv_cache import PagedDecodeBackend, PagedKVCache, PagedPrefillBackend, validate_host_metadata
from tts_service.runner.params import GenerationParams
from tts_service.runner.primed_voices import PrimedVoices, reference_key
from tts_service.runner.timing import PhaseTimer

# CUDA's lower numbers run first: the engine's streams above the default (0), which other work on the device (the
# forced aligner's stream) keeps.
ENGINE_STREAM_PRIORITY = -1

@dataclass(frozen=True)
class PrefillInput:
    slot: int
    block_ids: tuple[int, ...]
    prompt: Prompt
    params: GenerationParams
    speaker_embedding: torch.Tensor | None = None
    # A preempted request resumes by re-reading its frames, each with the text token it consumed.
    resumed_frames: tuple[tuple[int, ...], ...] = ()
    resumed_text_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class DecodeInput:
    slot: int
    block_ids: tuple[int, ...]
    position: int  # KV position of this step's input (the previous frame)
    frame_index: int  # index of the frame this step produces
    text_id: int  # text token added to the previous frame's embedding


@dataclass(frozen=True)
class AudioRestart:
    """A slot's audio stream starts over, first decoding `context` [T, G] int64, whose audio nobody hears: the
    reference frames of an in-context voice clone, and after a preemption also the frames whose audio was already
    sent, so that the stream's state is rebuilt (equal up to float rounding)."""

    slot: int
    context: np.ndarray
    # The context is a clone's reference frames alone, which start every stream in that voice: the runner may
    # start this one from the state they left before (`primed_voices`).
    is_voice_reference: bool = False


@dataclass(frozen=True)
class StepInput:
    prefills: tuple[PrefillInput, ...] = ()
    decodes: tuple[DecodeInput, ...] = ()
    # Slots whose new frame is decoded to audio on the device right behind the frames (a chunk of that frame
    # alone, the slot's audio stream having nothing older left to decode): no round trip through the host first.
    audio_slots: frozenset[int] = frozenset()
    # Queued on the codec's stream once the frames are, before any audio of the step.
    restarts: tuple[AudioRestart, ...] = ()


@dataclass(frozen=True)
class StepOutput:
    prefill_frames: np.ndarray  # [num_prefills - len(failed_prefills), G] int64, in StepInput order
    decode_frames: np.ndarray  # [num_decodes, G] int64
    # Prefills whose own inputs could not be built, by index in StepInput.prefills: those requests
    # fail alone, the rest of the step runs without them.
    failed_prefills: dict[int, str] = field(default_factory=dict)


class HostCopy:
    """A device tensor's copy on its way to the host; `result()` waits for it alone. On CUDA the copy goes to
    pinned memory behind an event, so it is queued after the work that makes the tensor instead of waiting for
    it (a graph's output buffer is reused by its next replay, which the stream orders after this copy): the host
    can queue a step's frames beside its codec call and hand the audio out while both run."""

    def __init__(self, values: torch.Tensor) -> None:
        self._ready: torch.cuda.Event | None = None
        self._error: Exception | None = None
        if values.device.type != "cuda":
            self._host = values.to("cpu", copy=True)
            return
        self._host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        self._host.copy_(values, non_blocking=True)
        self._ready = torch.cuda.Event()
        self._ready.record()

    @classmethod
    def failed(cls, error: Exception) -> HostCopy:
        """A copy that never started: its result() raises `error`."""
        copy = cls(torch.zeros(0))
        copy._error = error
        return copy

    def result(self) -> np.ndarray:
        if self._error is not None:
            raise self._error
        if self._ready is not None:
            self._ready.synchronize()
        # Copied out of the pinned buffer, which streams' unread chunks would otherwise keep pinned.
        return self._host.numpy().copy()


class PendingStep:
    """A step's frames on their way to the host; `result()` waits for them. `audio` is the samples of the frames
    of `audio_slots` (the step's `StepInput.audio_slots` that made a frame, in row order), still being decoded."""

    def __init__(self, frames: torch.Tensor | None, num_decodes: int, failed: dict[int, str],
                 num_groups: int) -> None:
        self._frames = None if frames is None else HostCopy(frames)
        self._num_decodes = num_decodes
        self._failed = failed
        self._num_groups = num_groups
        self.audio: HostCopy | None = None
        self.audio_slots: tuple[int, ...] = ()
        self.failed_restarts: dict[int, str] = {}  # by slot: the stream's context failed to decode

    def result(self) -> StepOutput:
        if self._frames is None:
            empty = np.zeros((0, self._num_groups), dtype=np.int64)
            return StepOutput(empty, empty, self._failed)
        frames = self._frames.result()
        return StepOutput(frames[self._num_decodes:], frames[:self._num_decodes], self._failed)


@dataclass
class _FrameBuffers:
    """A step's frame rows: decodes first, then prefills' first frames, then padding (the scratch slot).

    The talker decode graph reads the first rows' slots and text and writes their hidden states; the
    sampling graph turns every row's hidden state into a frame.
    """

    slots: torch.Tensor  # [max_batch] int64
    text_ids: torch.Tensor  # [max_batch] int64: decodes only
    frame_index: torch.Tensor  # [max_batch] int64
    hidden: torch.Tensor  # [max_batch, H]
    frames: torch.Tensor  # [max_batch, G] int64
    talker_graphs: dict[int, torch.cuda.CUDAGraph] = field(default_factory=dict)
    sampling_graphs: dict[int, torch.cuda.CUDAGraph] = field(default_factory=dict)


@dataclass
class _PrefillBuffers:
    """Right-padded prompt embeddings -> each row's last hidden state, captured per (batch, length) bucket."""

    inputs: torch.Tensor  # [max_batch, max_length, H]
    lengths: torch.Tensor  # [max_batch] int64; padding rows hold 0 and touch only the scratch block
    block_tables: torch.Tensor  # [max_batch, max_width] int32
    positions: torch.Tensor  # [max_length] int64: 0, 1, 2, ...
    last_hidden: torch.Tensor  # [max_batch, H]
    graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = field(default_factory=dict)


@contextlib.contextmanager
def _autotuned_convolutions() -> Iterator[None]:
    """cuDNN times its candidate kernels for each new shape (`cudnn.benchmark`) instead of picking one by its
    heuristics, which at many rows pick kernels that write NCHW and convert back. On only while the codec's
    graphs are captured: they keep the fastest kernels, and nothing else pays to autotune (the voice encoders
    meet a new shape with every reference clip)."""
    was_on = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = was_on


@dataclass
class _CodecBuffers:
    """Codes of a chunk per row -> samples, with the rows' stream state gathered and stored in-graph."""

    slots: torch.Tensor  # [max_batch] int64; padding rows use the scratch row
    codes: torch.Tensor  # [max_batch, G, max_chunk] int64
    audio: torch.Tensor  # [max_batch, max_chunk * samples_per_frame] float32
    graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = field(default_factory=dict)


class ModelRunner:
    def __init__(self, model: LoadedModel, config: RunnerConfig) -> None:
        self.model = model
        self.config = config
        self.talker = model.talker
        self.device = model.device
        self.dtype = self.talker.codec_head.weight.dtype
        self.kernels = KernelPolicy.build(self.device, self.dtype, use_fused_kernels=config.use_fused_kernels,
                                          use_predictor_kernel=config.use_predictor_kernel)
        is_fused = self.kernels.fused
        use_fused_kernels(self.talker, is_fused)
        model.codec_decoder.use_fused_kernels(is_fused)
        # Fused (CUDA), the talker's steps gather RoPE rows for every position a row's block table can address.
        self.rope_rows = (self.talker.rope_rows(config.max_blocks_per_request * config.block_size, self.dtype)
                          if is_fused else None)
        talker_config = model.config.talker
        self.num_groups = talker_config.num_code_groups
        self.tts_pad_id = model.config.tts_pad_token_id
        self.buckets = config.batch_buckets()
        max_batch = self.buckets[-1]

        self.state = SlotState.allocate(config.max_num_slots, talker_config.layers.vocab_size, self.num_groups,
                                        self.device)
        memory = predictor_memory(self.talker, max_batch, self.kernels)
        one_call = predictor_call(self.talker, memory, self.kernels)
        self.sampler = FrameSampler(self.talker, self.state, memory, one_call)
        self.kv_cache = PagedKVCache(talker_config.layers.num_hidden_layers, self._num_kv_blocks(),
                                     config.block_size, talker_config.layers.num_key_value_heads,
                                     talker_config.layers.head_dim, self.dtype, self.device)
        self.decode_backend = PagedDecodeBackend(self.kv_cache, max_batch, config.max_blocks_per_request)
        self.prefill_backend = PagedPrefillBackend(self.kv_cache)
        # Which paths this run takes, written once at start (`Engine.create` logs it).
        self.kernel_paths = self.kernels.active_paths(decode_attention=self.decode_backend.use_triton,
                                                      predictor_pass=one_call is not None)
        scratch = self.state.scratch_slot
        self.rows = _FrameBuffers(
            slots=torch.full((max_batch,), scratch, dtype=torch.int64, device=self.device),
            text_ids=torch.full((max_batch,), self.tts_pad_id, dtype=torch.int64, device=self.device),
            frame_index=torch.zeros(max_batch, dtype=torch.int64, device=self.device),
            hidden=torch.zeros(max_batch, talker_config.layers.hidden_size, dtype=self.dtype, device=self.device),
            frames=torch.zeros(max_batch, self.num_groups, dtype=torch.int64, device=self.device),
        )
        # Row max_num_slots is the codec's scratch row, as SlotState's last row is the sampler's.
        self.codec_state = model.codec_decoder.new_stream_state(config.max_num_slots + 1)
        self.codec_scratch_row = config.max_num_slots
        self.primed_voices = PrimedVoices(config.max_primed_voices)
        max_chunk = max(config.codec_graph_chunk_sizes, default=1)
        samples_per_frame = model.speech_config.samples_per_frame
        self.codec = _CodecBuffers(
            slots=torch.full((max_batch,), self.codec_scratch_row, dtype=torch.int64, device=self.device),
            codes=torch.zeros(max_batch, self.num_groups, max_chunk, dtype=torch.int64, device=self.device),
            audio=torch.zeros(max_batch, max_chunk * samples_per_frame, dtype=torch.float32, device=self.device),
        )
        self.prefill_batch_buckets, self.prefill_length_buckets = config.prefill_buckets()
        self.prefill = self._allocate_prefill_buffers(talker_config.layers.hidden_size)
        self.pad_embedding = embed_text_ids(self.talker, [self.tts_pad_id])[0]
        self.staging = _IdStaging(self.device)
        # The codec decodes on a stream of its own, so that a step's audio is decoded beside the next step's
        # frames instead of after them: the frame step's small kernels leave SMs idle, which the codec's
        # convolutions partly fill (about 1 ms a step at 128 streams on an H100). Its graphs have their own
        # memory pool, and its inputs come from the host, or from the frame rows behind an event each way.
        self.codec_stream = (torch.cuda.Stream(self.device, priority=ENGINE_STREAM_PRIORITY)
                             if self.device.type == "cuda" else None)
        # The frame graphs replay on a stream of their own too, for its priority: another stream's kernels (the
        # forced aligner's) then wait for an SM while the frames have blocks to run, never the frames for them.
        self.frame_stream = (torch.cuda.Stream(self.device, priority=ENGINE_STREAM_PRIORITY)
                             if self.device.type == "cuda" else None)
        # The codec's stream reads a step's frames straight from the frame rows, which the next sampling pass
        # overwrites: that pass waits for this event, recorded once they are read.
        self._frames_read: torch.cuda.Event | None = None
        self.uses_graphs = config.use_cuda_graphs and self.device.type == "cuda"
        # Prefill calls run eagerly although graphs are on: a batch or prompt beyond every captured bucket.
        self.num_eager_prefills = 0
        if self.uses_graphs:
            self._capture_graphs()
        self.timer = PhaseTimer(self.device) if config.profile_steps else None

    # -- sizing -------------------------------------------------------------------------------

    def _num_kv_blocks(self) -> int:
        if self.config.num_kv_blocks is not None:
            return self.config.num_kv_blocks
        layers = self.model.config.talker.layers
        if self.device.type != "cuda":
            return self.config.max_num_slots * self.config.max_blocks_per_request // 4 + 1
        free, _ = torch.cuda.mem_get_info(self.device)
        return PagedKVCache.num_blocks_for_budget(int(free * self.config.kv_memory_fraction),
                                                  layers.num_hidden_layers, self.config.block_size,
                                                  layers.num_key_value_heads, layers.head_dim, self.dtype)

    @property
    def num_kv_blocks(self) -> int:
        """Blocks requests may use (the cache's scratch block is not one of them)."""
        return self.kv_cache.scratch_block

    def _allocate_prefill_buffers(self, hidden_size: int) -> _PrefillBuffers:
        max_batch = max(self.prefill_batch_buckets, default=0)
        max_length = max(self.prefill_length_buckets, default=0)
        max_width = -(-max_length // self.config.block_size)
        device = self.device
        return _PrefillBuffers(
            inputs=torch.zeros(max_batch, max_length, hidden_size, dtype=self.dtype, device=device),
            lengths=torch.zeros(max_batch, dtype=torch.int64, device=device),
            block_tables=torch.full((max_batch, max_width), self.kv_cache.scratch_block, dtype=torch.int32,
                                    device=device),
            positions=torch.arange(max_length, device=device),
            last_hidden=torch.zeros(max_batch, hidden_size, dtype=self.dtype, device=device))

    # -- decode -------------------------------------------------------------------------------

    def _talker_decode_step(self, batch: int) -> None:
        """The talker's next position for the first `batch` rows: their previous frame plus text in, hidden out."""
        rows = self.rows
        inputs = self.talker.next_inputs(self.state.last_frame, rows.slots[:batch], rows.text_ids[:batch])
        positions = self.decode_backend.positions[:batch]
        rows.hidden[:batch] = self.talker.hidden(inputs[:, None], positions[:, None], self.decode_backend,
                                                 self.rope_rows)[:, 0]

    def _sampling_step(self, batch: int) -> None:
        """Hidden state -> frame for the first `batch` rows: codebook 0, then the code predictor's codebooks."""
        rows = self.rows
        rows.frames[:batch] = self.sampler(rows.hidden[:batch], rows.slots[:batch], rows.frame_index[:batch])

    def _codec_step(self, batch: int, num_frames: int) -> None:
        buffers = self.codec
        slots = buffers.slots[:batch]
        rows = self._codec_rows(slots)
        audio = self.model.codec_decoder.decode_chunk(buffers.codes[:batch, :, :num_frames], rows)
        self._store_codec_rows(slots, rows)
        buffers.audio[:batch, :audio.shape[1]] = audio.float()

    def _prefill_step(self, batch: int, length: int) -> None:
        buffers = self.prefill
        width = -(-length // self.config.block_size)
        lengths = buffers.lengths[:batch]
        self.prefill_backend.bind_static(buffers.block_tables[:batch, :width], lengths)
        hidden = self.talker.hidden(buffers.inputs[:batch, :length], buffers.positions[:length].expand(batch, -1),
                                    self.prefill_backend, self.rope_rows)
        rows = torch.arange(batch, device=self.device)
        buffers.last_hidden[:batch] = hidden[rows, (lengths - 1).clamp(min=0)]

    def _capture_graphs(self) -> None:
        assert self.codec_stream is not None and self.frame_stream is not None
        self.decode_backend.set_metadata(torch.zeros(0, 1, dtype=torch.int32), torch.zeros(0, dtype=torch.int64))
        frame_stream = self.frame_stream
        streams = (frame_stream, self.codec_stream)
        for stream in streams:
            stream.wait_stream(torch.cuda.current_stream(self.device))

        def capture(step: Callable[[], None], pool: tuple[int, int]) -> torch.cuda.CUDAGraph:
            step()  # warm-up: lazy initialisation stays out of the graph
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=torch.cuda.current_stream(self.device)):
                step()
            return graph

        # The frame graphs share one pool, replayed one after another on one stream; the codec's graphs, which
        # run beside them, get another. They are captured on the codec's stream, so that they do not share the
        # cuBLAS workspace that PyTorch keeps per stream with the frame graphs either.
        frame_pool, codec_pool = torch.cuda.graph_pool_handle(), torch.cuda.graph_pool_handle()
        with torch.inference_mode():
            with torch.cuda.stream(frame_stream):
                for batch in reversed(self.buckets):
                    self.rows.talker_graphs[batch] = capture(lambda b=batch: self._talker_decode_step(b), frame_pool)
                    self.rows.sampling_graphs[batch] = capture(lambda b=batch: self._sampling_step(b), frame_pool)
                for batch in self.prefill_batch_buckets:
                    for length in self.prefill_length_buckets:
                        self.prefill.graphs[(batch, length)] = capture(
                            lambda b=batch, t=length: self._prefill_step(b, t), frame_pool)
            # The warm-up calls autotune; the captures find their choice.
            with torch.cuda.stream(self.codec_stream), _autotuned_convolutions():
                for batch in reversed(self.buckets):
                    for num_frames in self.config.codec_graph_chunk_sizes:
                        self.codec.graphs[(batch, num_frames)] = capture(
                            lambda b=batch, t=num_frames: self._codec_step(b, t), codec_pool)
                # The warm-ups advanced the scratch row's stream; keep it bounded at its start.
                self.codec_state.reset_rows(torch.tensor([self.codec_scratch_row], device=self.device))
        for stream in streams:
            torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)

    def captured_graph_batch_sizes(self) -> dict[str, list[int]]:
        """Each captured CUDA graph's batch size, by kind (empty lists when the runner runs eagerly)."""
        return {"decode": sorted(self.rows.talker_graphs), "frame_sampling": sorted(self.rows.sampling_graphs),
                "codec": sorted(batch for batch, _ in self.codec.graphs),
                "prefill": sorted(batch for batch, _ in self.prefill.graphs)}

    def bucket_for(self, batch: int) -> int:
        bucket = _smallest_at_least(self.buckets, batch)
        if bucket is None:
            raise ValueError(f"batch {batch} exceeds the largest bucket {self.buckets[-1]}")
        return bucket

    def _decode(self, decodes: tuple[DecodeInput, ...]) -> torch.Tensor:
        """A whole frame for every decode (the frame-step benchmark's unit of work)."""
        self._start_decodes(decodes)
        return self._sample_frames(len(decodes), (), None)

    def replay_decode(self, batch: int) -> None:
        """The last decode step's talker and sampling passes again, on the metadata it left (the frame-step
        benchmark's device-only timing: replayed back to back, the host stays ahead of the device)."""
        self._replay_or_run(self.rows.talker_graphs, self._talker_decode_step, batch)
        self._replay_or_run(self.rows.sampling_graphs, self._sampling_step, batch)

    def _load_rows(self, start: int, rows: list[tuple[int, int, int]]) -> None:
        """Frame rows `start`.. get (slot, text id, frame index) each, and the rows after them are padding: the
        scratch slot, which the sampling pass may write."""
        host = torch.tensor(rows, dtype=torch.int64).reshape(-1, 3)
        _load_padded(self.rows.slots[start:], host[:, 0], self.state.scratch_slot)
        _load_padded(self.rows.text_ids[start:], host[:, 1], self.tts_pad_id)
        _load_padded(self.rows.frame_index[start:], host[:, 2], 0)

    def _start_decodes(self, decodes: tuple[DecodeInput, ...]) -> None:
        """The talker's next position for every decode, into the first rows' hidden states."""
        self._load_rows(0, [(d.slot, d.text_id, d.frame_index) for d in decodes])
        self.decode_backend.set_metadata(_block_tables([d.block_ids for d in decodes]),
                                         torch.tensor([d.position for d in decodes], dtype=torch.int64))
        self._replay_or_run(self.rows.talker_graphs, self._talker_decode_step, len(decodes))

    def _sample_frames(self, num_decodes: int, prefills: tuple[PrefillInput, ...],
                       prefill_hidden: torch.Tensor | None) -> torch.Tensor:
        """Frames for the decodes (whose talker pass `_start_decodes` queued), then for the prefills (whose talker
        pass left `prefill_hidden`), as one sampling pass: [num_decodes + len(prefills), G] on the device."""
        batch = num_decodes + len(prefills)
        if prefill_hidden is not None:
            self._load_rows(num_decodes, [(item.slot, self.tts_pad_id, len(item.resumed_frames)) for item in prefills])
            self.rows.hidden[num_decodes:batch].copy_(prefill_hidden)
        if self._frames_read is not None:
            torch.cuda.current_stream(self.device).wait_event(self._frames_read)
            self._frames_read = None
        self._replay_or_run(self.rows.sampling_graphs, self._sampling_step, batch)
        return self.rows.frames[:batch]

    def _replay_or_run(self, graphs: dict[int, torch.cuda.CUDAGraph], step: Callable[[int], None],
                       batch: int) -> None:
        if self.uses_graphs:
            self._replay_frames(graphs[self.bucket_for(batch)])
        else:
            step(batch)

    def _replay_frames(self, graph: torch.cuda.CUDAGraph) -> None:
        """On the frame stream, ordered after what the caller's stream has queued and before what it queues next:
        a graph reads and writes only its static buffers, which nothing frees meanwhile."""
        assert self.frame_stream is not None
        caller = torch.cuda.current_stream(self.device)
        self.frame_stream.wait_stream(caller)
        with torch.cuda.stream(self.frame_stream):
            graph.replay()
        caller.wait_stream(self.frame_stream)

    # -- prefill ------------------------------------------------------------------------------

    def _prefill_embedding(self, item: PrefillInput, ids: PromptIds, uploaded: torch.Tensor) -> torch.Tensor:
        """One prefill's input embeddings from its ids on the device."""
        return embed_prompt_ids(self.talker, ids, uploaded, item.speaker_embedding)

    def _prefill_bucket(self, batch: int, longest: int) -> tuple[int, int] | None:
        """The captured (batch, length) bucket that holds this prefill; None when it must run eagerly."""
        batch_bucket = _smallest_at_least(self.prefill_batch_buckets, batch)
        length_bucket = _smallest_at_least(self.prefill_length_buckets, longest)
        if not self.uses_graphs or batch_bucket is None or length_bucket is None:
            return None
        return batch_bucket, length_bucket

    def _prefill_hidden_eager(self, embeds: list[torch.Tensor], lengths: torch.Tensor,
                              block_tables: torch.Tensor) -> torch.Tensor:
        longest = int(lengths.max())
        inputs = torch.stack([F.pad(e, (0, 0, 0, longest - e.shape[0])) for e in embeds])
        self.prefill_backend.set_metadata(block_tables, lengths)
        positions = torch.arange(longest, device=self.device).expand(len(embeds), -1)
        hidden = self.talker.hidden(inputs, positions, self.prefill_backend, self.rope_rows)
        last = (lengths - 1).to(self.device, non_blocking=True)
        return hidden[torch.arange(len(embeds), device=self.device), last]

    def _prefill_hidden_graph(self, bucket: tuple[int, int], embeds: list[torch.Tensor], lengths: torch.Tensor,
                              block_tables: torch.Tensor) -> torch.Tensor:
        batch_bucket, length_bucket = bucket
        width = -(-length_bucket // self.config.block_size)
        # A row may hold blocks for frames to come; its prompt needs only the first `width`.
        block_tables = block_tables[:, :width]
        validate_host_metadata(self.kv_cache, block_tables, torch.zeros_like(lengths), lengths)
        buffers = self.prefill
        for row, embedding in enumerate(embeds):
            buffers.inputs[row, :embedding.shape[0]].copy_(embedding)
        _load_padded(buffers.lengths[:batch_bucket], lengths, 0)
        tables = buffers.block_tables[:batch_bucket, :width]
        tables.fill_(self.kv_cache.scratch_block)
        tables[:len(embeds), :block_tables.shape[1]].copy_(block_tables, non_blocking=True)
        self._replay_frames(buffers.graphs[bucket])
        return buffers.last_hidden[:len(embeds)]

    def _prefill_hidden(self, embeds: list[torch.Tensor], lengths: torch.Tensor,
                        block_tables: torch.Tensor) -> torch.Tensor:
        """Each prompt's last hidden state, from captured graphs: in groups of the largest captured batch when
        the prefills outnumber it (a burst of admissions), eagerly only when a prompt is longer than every
        captured length (an eager prefill of many rows launches hundreds of kernels from the host)."""
        max_batch = max(self.prefill_batch_buckets, default=0)
        groups = [slice(start, start + max_batch) for start in range(0, len(embeds), max_batch)] if max_batch else []
        buckets = [self._prefill_bucket(len(embeds[group]), int(lengths[group].max())) for group in groups]
        if not groups or None in buckets:
            self.num_eager_prefills += int(self.uses_graphs)
            return self._prefill_hidden_eager(embeds, lengths, block_tables)
        if len(groups) == 1:
            return self._prefill_hidden_graph(buckets[0], embeds, lengths, block_tables)  # type: ignore[arg-type]
        # A replay overwrites the graph's output buffer: each group's rows are copied out before the next replay.
        return torch.cat([self._prefill_hidden_graph(bucket, embeds[group], lengths[group],  # type: ignore[arg-type]
                                                     block_tables[group]).clone()
                          for group, bucket in zip(groups, buckets, strict=True)])

    def _prefill(self, prefills: tuple[PrefillInput, ...], embeds: list[torch.Tensor],
                 resumed_code0: list[torch.Tensor | None]) -> torch.Tensor:
        """The talker over each prompt (its keys and values into the request's blocks) -> each last hidden state;
        the slots are set up for sampling the first frames (a resumed request's repetition penalty remembers the
        codebook-0 codes `resumed_code0` it already made)."""
        lengths = torch.tensor([e.shape[0] for e in embeds], dtype=torch.int64)
        block_tables = _block_tables([item.block_ids for item in prefills])
        last = self._prefill_hidden(embeds, lengths, block_tables)
        self.state.assign([item.slot for item in prefills], [item.params for item in prefills])
        for item, code0 in zip(prefills, resumed_code0, strict=True):
            if code0 is not None:
                self.state.seen[item.slot].index_fill_(0, code0, True)
        return last

    # -- step ---------------------------------------------------------------------------------

    def execute(self, step: StepInput) -> StepOutput:
        return self.start_step(step).result()

    @torch.inference_mode()
    def start_step(self, step: StepInput) -> PendingStep:
        """Queue the step's work on the device and return without waiting for it. The running requests' talker
        pass goes first: the device runs it while the host lays out the prefills (1.5 to 2.5 ms of host time a step
        at 128 streams on an H100, which the device spent idle when they went first)."""
        timer = self.timer
        if timer is not None:
            timer.start()
        if step.decodes:
            self._start_decodes(step.decodes)
            if timer is not None:
                timer.mark("decode")
        prefills, embeds, resumed_code0, failed = self._prefill_inputs(step.prefills)
        if not (prefills or step.decodes):
            return PendingStep(None, 0, failed, self.num_groups)
        prefill_hidden = None
        if prefills:
            if timer is not None:
                timer.mark("prefill_inputs")
            prefill_hidden = self._prefill(prefills, embeds, resumed_code0)
            if timer is not None:
                timer.mark("prefill")
        frames = self._sample_frames(len(step.decodes), prefills, prefill_hidden)
        if timer is not None:
            timer.mark("decode")
        # The step's one device-to-host copy (a copy, since the rows are reused next step).
        pending = PendingStep(frames, len(step.decodes), failed, self.num_groups)
        if timer is not None:
            timer.mark("copy")
        # After the frames, so that their host time (an index_fill_ per codec state tensor) is not spent while the
        # device waits for the talker pass; before the audio, which continues the restarted streams.
        pending.failed_restarts = self._restart_audio(step.restarts)
        row_slots = [d.slot for d in step.decodes] + [item.slot for item in prefills]
        audio_rows = [row for row, slot in enumerate(row_slots) if slot in step.audio_slots]
        if audio_rows:
            pending.audio_slots = tuple(row_slots[row] for row in audio_rows)
            try:
                pending.audio = self._start_frame_audio(audio_rows, list(pending.audio_slots))
            except Exception as error:  # the frames stand; the audio's requests fail when it is collected
                pending.audio = HostCopy.failed(error)
        return pending

    def _restart_audio(self, restarts: tuple[AudioRestart, ...]) -> dict[int, str]:
        """Each restart's stream reset and primed with its context; what failed, by slot."""
        if not restarts:
            return {}
        self.reset_audio([restart.slot for restart in restarts])
        failed: dict[int, str] = {}
        for restart in restarts:
            if restart.context.shape[0] == 0:
                continue
            try:
                if restart.is_voice_reference:
                    self._prime_voice(restart.slot, restart.context)
                else:
                    self.prime_audio([restart.slot], restart.context[None])
            except Exception as error:  # that request's audio fails; the step goes on
                failed[restart.slot] = f"{type(error).__name__}: {error}"
        return failed

    def _start_frame_audio(self, rows: list[int], slots: list[int]) -> HostCopy:
        """Queue the decoding of frame rows `rows` (just queued) as a one-frame chunk of each of `slots`' audio
        streams, reading them on the device. A row whose frame is the end of speech decodes a clamped code; its
        audio is the caller's to drop, and its stream ends there."""
        if self.codec_stream is not None:
            self.codec_stream.wait_stream(torch.cuda.current_stream(self.device))
        with self._codec_work():
            codes = self.rows.frames.index_select(0, self._queued_indices(rows))
            if self.codec_stream is not None:
                self._frames_read = torch.cuda.Event()
                self._frames_read.record()
            codes.clamp_(0, self.model.codec_decoder.config.codebook_size - 1)
            return HostCopy(self._decode_codes(slots, codes[:, :, None]))

    def _prefill_inputs(self, items: tuple[PrefillInput, ...]
                        ) -> tuple[tuple[PrefillInput, ...], list[torch.Tensor], list[torch.Tensor | None],
                                   dict[int, str]]:
        """Each prefill's embeddings (and a resumed request's codebook-0 codes), from one upload of every prompt's
        ids. Each request's inputs are checked and embedded apart, so that one request's bad input (a voice
        embedding of the wrong shape, say) fails that request alone."""
        failed: dict[int, str] = {}
        laid_out: list[tuple[int, PrefillInput, PromptIds]] = []
        for index, item in enumerate(items):
            try:
                ids = prompt_ids(item.prompt, item.speaker_embedding is not None, item.resumed_frames,
                                 item.resumed_text_ids)
            except Exception as error:  # charged to this request by the caller
                failed[index] = f"{type(error).__name__}: {error}"
                continue
            laid_out.append((index, item, ids))
        uploaded = self.staging.upload([ids.concatenated() for _, _, ids in laid_out])
        kept, embeds, resumed_code0 = [], [], []
        for (index, item, ids), values in zip(laid_out, uploaded, strict=True):
            try:
                embeds.append(self._prefill_embedding(item, ids, values))
            except Exception as error:
                failed[index] = f"{type(error).__name__}: {error}"
                continue
            kept.append(item)
            resumed_code0.append(ids.resumed_codebook0(values))
        return tuple(kept), embeds, resumed_code0, failed

    # -- audio --------------------------------------------------------------------------------

    def _codec_rows(self, slots: torch.Tensor) -> CodecStreamState:
        return self.codec_state.select_rows(slots, share_rings=True)

    def _store_codec_rows(self, slots: torch.Tensor, rows: CodecStreamState) -> None:
        self.codec_state.store_rows(slots, rows)

    def _queued_indices(self, values: list[int]) -> torch.Tensor:
        """On the codec's stream, a blocking upload would wait for the previous step's codec call while the next
        frames wait to be queued."""
        return queued_upload(values, torch.int64, self.device)

    def _on_codec_stream(self) -> contextlib.AbstractContextManager[object]:
        """Where every piece of the codec's device work is queued, so that it runs in the order queued."""
        return contextlib.nullcontext() if self.codec_stream is None else torch.cuda.stream(self.codec_stream)

    @contextlib.contextmanager
    def _codec_work(self) -> Iterator[None]:
        """On the codec's stream, and charged to `codec` by the step profiler when it is on."""
        with self._on_codec_stream():
            if self.timer is not None:
                self.timer.start()
            yield
            if self.timer is not None:
                self.timer.mark("codec")

    @torch.inference_mode()
    def reset_audio(self, slots: list[int]) -> None:
        with self._on_codec_stream():
            self.codec_state.reset_rows(self._queued_indices(slots))

    def decode_audio(self, slots: list[int], codes: np.ndarray) -> np.ndarray:
        """Decode the next `codes` [n, T, G] of each slot's audio stream -> float32 samples [n, T * spf]."""
        return self.start_audio(slots, codes).result()

    @torch.inference_mode()
    def start_audio(self, slots: list[int], codes: np.ndarray) -> HostCopy:
        """Queue the decoding of `codes` as `decode_audio` does, without waiting for it: its result() is the
        float32 samples [n, T * samples_per_frame]. Bad codes raise here."""
        with self._codec_work():
            return HostCopy(self._decode_audio(slots, codes))

    @torch.inference_mode()
    def prime_audio(self, slots: list[int], codes: np.ndarray) -> None:
        """Advance each slot's audio stream through `codes` whose audio nobody hears (a clone's reference frames,
        a resumed stream's frames already sent), queued on the device without a copy to the host."""
        with self._codec_work():
            self._decode_audio(slots, codes)

    @torch.inference_mode()
    def _prime_voice(self, slot: int, reference: np.ndarray) -> None:
        """`prime_audio` of one slot with a clone's reference frames [T, G], from the state they left a stream of
        this voice before when it is kept; else decoded, and the state they leave kept."""
        key = reference_key(reference)
        kept = self.primed_voices.get(key)
        if kept is None:
            self.prime_audio([slot], reference[None])
            if self.primed_voices.max_entries:
                with self._codec_work():
                    self.primed_voices.put(key, self.codec_state.select_rows(self._queued_indices([slot])))
            return
        with self._codec_work():
            self.codec_state.store_rows(self._queued_indices([slot]), kept)

    def _decode_audio(self, slots: list[int], codes: np.ndarray) -> torch.Tensor:
        # Checked on the host: an out-of-range code would be a device-side assert, which poisons
        # the whole CUDA context instead of failing one request.
        codebook_size = self.model.codec_decoder.config.codebook_size
        if codes.size and (codes.min() < 0 or codes.max() >= codebook_size):
            bad = np.argwhere((codes < 0) | (codes >= codebook_size))[0]
            raise ValueError(f"code {int(codes[tuple(bad)])} at (row, frame, codebook) {tuple(bad.tolist())} "
                             f"is outside the codec's [0, {codebook_size})")
        return self._decode_codes(slots, torch.from_numpy(codes).to(self.device, non_blocking=True).transpose(1, 2))

    def _decode_codes(self, slots: list[int], chunk: torch.Tensor) -> torch.Tensor:
        """Decode `chunk` [n, G, T] (valid codes, on the device) as the next T frames of each slot's audio stream."""
        batch, num_frames = len(slots), chunk.shape[2]
        graph = self.codec.graphs.get((self.bucket_for(batch), num_frames)) if batch <= self.buckets[-1] else None
        if graph is None:
            index = self._queued_indices(slots)
            rows = self._codec_rows(index)
            audio = self.model.codec_decoder.decode_chunk(chunk, rows)
            self._store_codec_rows(index, rows)
            return audio.float()
        buffers = self.codec
        _load_padded(buffers.slots, torch.tensor(slots, dtype=torch.int64), self.codec_scratch_row)
        buffers.codes[:batch, :, :num_frames].copy_(chunk)
        graph.replay()
        return buffers.audio[:batch, :num_frames * self.model.speech_config.samples_per_frame]


class _IdStaging:
    """Host buffers for every id a step uploads, pinned on CUDA: a step's prompts go to the device in a single
    copy queued behind the device's work, with no page-locking per prompt. There are two, used in turn: a buffer
    is written again only once the copy from it two uploads ago is done, long since (that step's frames have come
    back), also when a step is queued while the step before it still runs, whose copy may not have started."""

    def __init__(self, device: torch.device, num_ids: int = 1 << 16) -> None:
        self.device = device
        self.buffers = [self._allocate(num_ids), self._allocate(num_ids)]
        self.copied: list[torch.cuda.Event | None] = [None, None]
        self.turn = 0

    def _allocate(self, num_ids: int) -> torch.Tensor:
        return torch.empty(num_ids, dtype=torch.int64, pin_memory=self.device.type == "cuda")

    def upload(self, arrays: list[np.ndarray]) -> list[torch.Tensor]:
        """The arrays' int64 values on the device, one tensor each."""
        sizes = [len(values) for values in arrays]
        total = sum(sizes)
        if not total:
            return [torch.zeros(0, dtype=torch.int64, device=self.device) for _ in arrays]
        turn, self.turn = self.turn, 1 - self.turn
        copied = self.copied[turn]
        if copied is not None:
            copied.synchronize()
        if total > len(self.buffers[turn]):
            self.buffers[turn] = self._allocate(max(total, 2 * len(self.buffers[turn])))
        host = self.buffers[turn][:total]
        np.concatenate(arrays, out=host.numpy())
        if self.device.type != "cuda":
            return list(host.clone().split(sizes))
        uploaded = host.to(self.device, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self.copied[turn] = event
        return list(uploaded.split(sizes))


def _smallest_at_least(sizes: tuple[int, ...], value: int) -> int | None:
    """The first of the increasing `sizes` that is >= value; None when value exceeds them all."""
    index = bisect.bisect_left(sizes, value)
    return sizes[index] if index < len(sizes) else None


def _block_tables(rows: list[tuple[int, ...]]) -> torch.Tensor:
    """Block ids per row, right-padded with block 0 (never read past a row's positions) to one width."""
    width = max(len(row) for row in rows)
    return torch.tensor([row + (0,) * (width - len(row)) for row in rows], dtype=torch.int32)


def _load_padded(buffer: torch.Tensor, values: torch.Tensor, padding: int) -> None:
    """A static graph input: `values` in its first rows, `padding` (a scratch row or a neutral id) after."""
    buffer[len(values):].fill_(padding)
    buffer[:len(values)].copy_(values, non_blocking=True)
