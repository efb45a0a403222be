"""The forced aligner as the engine runs it: batches packed into fixed shapes and replayed from captured CUDA graphs.

Eager, one batch of the aligner is about 1,500 kernel launches from Python: 30-100 ms of host time for a few ms of
GPU work, and, in the engine's process, a thread that takes the GIL from the engine's at every launch (at 20 req/s
on an H100 that held word timings back by seconds and first audio by 20 ms). Packed, a batch is a few host copies
and one graph replay on a stream of the aligner's own, whose kernels run beside the engine's. Its text decoder takes
the fused kernels the talker's layers take (`layers.use_fused_kernels`: packed q/k/v and gate/up, norms, q/k norm
with RoPE, SiLU), which leaves a batch fewer kernels to interleave with the engine's frames.

The layout: every clip's mel frames cut into whole chunks (`CHUNK_FRAMES`; a short last one zero-padded), all the
clips' chunks one after another, and every prompt one after another in one row, each attending only to itself
(`aligner_model.PackedBatch`). Shapes then depend only on the number of chunks and of prompt tokens, rounded up to
a bucket; one graph per bucket, sharing one memory pool. A batch beyond the largest bucket is cut into batches that
fit, and a single clip beyond it runs eagerly. Packing changes which kernels run, not the math: the classes are the
eager path's up to float rounding (tests/model/test_aligner_packed.py, tests/gpu/test_aligner_runner_cuda.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tts_service.model import layers
from tts_service.model.aligner import AlignmentItem, ClipFeatures, ForcedAligner, WordTiming
from tts_service.model.aligner_config import CHUNK_FRAMES, conv_output_length
from tts_service.model.aligner_model import PackedBatch
from tts_service.model.aligner_text import split_words
from tts_service.model.kernel_policy import KernelPolicy

# Audio tokens per whole chunk (a second of audio).
TOKENS_PER_CHUNK = conv_output_length(CHUNK_FRAMES)
# Prompt tokens a bucket holds per chunk: a second's 13 audio tokens and room for about seven words of text (one or
# two tokens each and two timestamps), well above speech's pace.
PROMPT_TOKENS_PER_CHUNK = 40
# Chunks (seconds of audio, all clips together) of the buckets: past the last, a batch is cut. Steps of about 1.4x
# bound the padding; the last bounds what packing costs, since every packed token's attention spans the whole row
# (at 64 chunks about half the cost of the layers' matrices, at 256 twice it).
BUCKET_CHUNKS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


@dataclass(frozen=True)
class Bucket:
    num_chunks: int
    num_tokens: int  # prompt tokens

    @property
    def num_positions(self) -> int:
        """Encoder positions: every chunk's, whether a frame is behind it or not."""
        return self.num_chunks * TOKENS_PER_CHUNK


BUCKETS = tuple(Bucket(chunks, chunks * PROMPT_TOKENS_PER_CHUNK) for chunks in BUCKET_CHUNKS)


def num_chunks(frames: int) -> int:
    return -(-frames // CHUNK_FRAMES)


def chunk_lengths(frames: int) -> list[int]:
    """A clip's frames cut into the encoder's chunks: whole ones, then what is left."""
    return [min(CHUNK_FRAMES, frames - start) for start in range(0, frames, CHUNK_FRAMES)]


@dataclass
class HostBatch:
    """A packed batch on the host (`PackedBatch`'s fields, unpadded), and where each clip's prompt lies."""

    chunks: np.ndarray  # [C, mel bins, CHUNK_FRAMES] float32
    chunk_width: np.ndarray  # [C]
    token_clip: np.ndarray  # [C * TOKENS_PER_CHUNK]
    input_ids: np.ndarray  # [M]
    positions: np.ndarray
    segment: np.ndarray
    audio_source: np.ndarray
    prompt_starts: list[int]

    @property
    def num_chunks(self) -> int:
        return self.chunks.shape[0]

    def on(self, device: torch.device, dtype: torch.dtype) -> PackedBatch:
        """The batch as the model reads it, unpadded (the eager packed path)."""
        def ids(values: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(values).to(device)

        return PackedBatch(torch.from_numpy(self.chunks).to(device, dtype), ids(self.chunk_width),
                           ids(self.token_clip), ids(self.input_ids), ids(self.positions), ids(self.segment),
                           ids(self.audio_source))

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]


def pack(clips: ClipFeatures, rows: Sequence[int], audio_pad_id: int) -> HostBatch:
    """The clips `rows` of a batch, laid out one after another (see the module's docstring)."""
    chunks, chunk_width, token_clip, kept, prompt_starts = [], [], [], [], []
    ids: list[int] = []
    positions: list[int] = []
    segment: list[int] = []
    for index, row in enumerate(rows):
        frames = clips.frames[row]
        count = num_chunks(frames)
        features = clips.features[row]
        padded = np.zeros((features.shape[0], count * CHUNK_FRAMES), dtype=np.float32)
        padded[:, :frames] = features.numpy()
        chunks.append(padded.reshape(padded.shape[0], count, CHUNK_FRAMES).transpose(1, 0, 2))
        # Alone, a clip's chunks are padded to its longest.
        chunk_width += [min(frames, CHUNK_FRAMES)] * count
        for length in chunk_lengths(frames):
            valid = conv_output_length(length)
            kept += range(len(token_clip), len(token_clip) + valid)
            token_clip += [index] * valid + [-1] * (TOKENS_PER_CHUNK - valid)
        prompt = clips.prompts[row]
        prompt_starts.append(len(ids))
        ids += prompt
        positions += range(len(prompt))
        segment += [index] * len(prompt)
    input_ids = np.asarray(ids, dtype=np.int64)
    # Each `<|audio_pad|>`, in order, takes the next of the encoder's kept positions, in order.
    audio_source = np.zeros_like(input_ids)
    is_audio = input_ids == audio_pad_id
    if int(is_audio.sum()) != len(kept):
        raise ValueError(f"the prompts hold {int(is_audio.sum())} audio placeholders for {len(kept)} audio tokens")
    audio_source[is_audio] = kept
    return HostBatch(np.concatenate(chunks), np.asarray(chunk_width, dtype=np.int64),
                     np.asarray(token_clip, dtype=np.int64), input_ids,
                     np.asarray(positions, dtype=np.int64), np.asarray(segment, dtype=np.int64), audio_source,
                     prompt_starts)


def smallest_bucket(num_chunks_needed: int, num_tokens_needed: int) -> Bucket | None:
    return next((bucket for bucket in BUCKETS
                 if bucket.num_chunks >= num_chunks_needed and bucket.num_tokens >= num_tokens_needed), None)


def batches_that_fit(clips: ClipFeatures, rows: Sequence[int]) -> Iterator[list[int]]:
    """`rows` in order, cut into runs that each fit the largest bucket; a row that fits none comes alone."""
    largest = BUCKETS[-1]
    run: list[int] = []
    run_chunks = run_tokens = 0
    for row in rows:
        row_chunks, row_tokens = num_chunks(clips.frames[row]), len(clips.prompts[row])
        if run and (run_chunks + row_chunks > largest.num_chunks or run_tokens + row_tokens > largest.num_tokens):
            yield run
            run, run_chunks, run_tokens = [], 0, 0
        run.append(row)
        run_chunks += row_chunks
        run_tokens += row_tokens
    if run:
        yield run


class _StaticBatch:
    """The device buffers a graph reads, at the largest bucket's size, and the host's pinned copies of them."""

    def __init__(self, num_mel_bins: int, device: torch.device, dtype: torch.dtype, pad_id: int) -> None:
        largest = BUCKETS[-1]
        self.pad_id = pad_id

        is_cuda = device.type == "cuda"

        def host(shape: tuple[int, ...], kind: torch.dtype) -> torch.Tensor:
            """Pinned on a GPU's host, so that copies to and from it are queued, not waited for."""
            return torch.zeros(shape, dtype=kind, pin_memory=is_cuda)

        chunks_shape = (largest.num_chunks, num_mel_bins, CHUNK_FRAMES)
        self.host_chunks, self.chunks = host(chunks_shape, torch.float32), torch.zeros(chunks_shape, device=device)
        self.features = torch.zeros(chunks_shape, dtype=dtype, device=device)
        self.host_chunk_width = host((largest.num_chunks,), torch.int64)
        self.chunk_width = torch.zeros(largest.num_chunks, dtype=torch.int64, device=device)
        self.host_token_clip = host((largest.num_positions,), torch.int64)
        self.token_clip = torch.zeros(largest.num_positions, dtype=torch.int64, device=device)
        # The prompt row's ids, positions, segments and audio sources.
        self.host_ids = host((4, largest.num_tokens), torch.int64)
        self.ids = torch.zeros(4, largest.num_tokens, dtype=torch.int64, device=device)
        self.host_classes = host((largest.num_tokens,), torch.int64)
        self.classes = torch.zeros(largest.num_tokens, dtype=torch.int64, device=device)

    def view(self, bucket: Bucket) -> PackedBatch:
        ids = self.ids[:, :bucket.num_tokens]
        return PackedBatch(self.features[:bucket.num_chunks], self.chunk_width[:bucket.num_chunks],
                           self.token_clip[:bucket.num_positions], ids[0], ids[1], ids[2], ids[3])

    def load(self, batch: HostBatch, bucket: Bucket) -> None:
        """The batch into the host copies, padded to `bucket`, then onto the device in three copies."""
        chunks, tokens, positions = batch.num_chunks, batch.num_tokens, bucket.num_positions
        self.host_chunks[:chunks] = torch.from_numpy(batch.chunks)
        self.host_chunks[chunks:bucket.num_chunks] = 0
        self.host_chunk_width[:chunks] = torch.from_numpy(batch.chunk_width)
        self.host_chunk_width[chunks:bucket.num_chunks] = 0
        self.host_token_clip[:batch.token_clip.shape[0]] = torch.from_numpy(batch.token_clip)
        self.host_token_clip[batch.token_clip.shape[0]:positions] = -1
        rows = (batch.input_ids, batch.positions, batch.segment, batch.audio_source)
        padding = (self.pad_id, 0, -1, 0)
        for index, (values, pad) in enumerate(zip(rows, padding, strict=True)):
            self.host_ids[index, :tokens] = torch.from_numpy(values)
            self.host_ids[index, tokens:bucket.num_tokens] = pad
        self.chunks[:bucket.num_chunks].copy_(self.host_chunks[:bucket.num_chunks], non_blocking=True)
        self.features[:bucket.num_chunks].copy_(self.chunks[:bucket.num_chunks])
        self.chunk_width[:bucket.num_chunks].copy_(self.host_chunk_width[:bucket.num_chunks], non_blocking=True)
        self.token_clip[:positions].copy_(self.host_token_clip[:positions], non_blocking=True)
        self.ids[:, :bucket.num_tokens].copy_(self.host_ids[:, :bucket.num_tokens], non_blocking=True)


class AlignerRunner:
    """`ForcedAligner.align_many`, packed and (on a GPU, with graphs on) replayed from captured graphs on a stream
    of its own. Not thread-safe: one thread aligns at a time (the engine's aligner worker). With `use_fused_kernels`
    (the engine's flag), the aligner's text decoder is switched to the fused kernels where they run, before any graph
    is captured."""

    def __init__(self, aligner: ForcedAligner, use_graphs: bool = True, use_fused_kernels: bool = True) -> None:
        self.aligner = aligner
        self.source = aligner.source
        self.is_random = aligner.is_random
        self.device = aligner.device
        is_cuda = self.device.type == "cuda"
        self.is_fused = use_fused_kernels and KernelPolicy.runs_kernels(self.device)
        if self.is_fused:
            layers.use_fused_kernels(aligner.model.thinker.model, True)
        # The default priority, below the engine's streams (runner.ENGINE_STREAM_PRIORITY): the frames go first.
        self.stream = torch.cuda.Stream(self.device, priority=0) if is_cuda else None
        self._static = _StaticBatch(aligner.config.audio.num_mel_bins, self.device, aligner.dtype,
                                    aligner.tokens.padding)
        self._graphs: dict[Bucket, torch.cuda.CUDAGraph] = {}
        self._done = torch.cuda.Event() if is_cuda else None
        if use_graphs and is_cuda:
            self._capture()

    @property
    def captured_buckets(self) -> list[Bucket]:
        return sorted(self._graphs, key=lambda bucket: bucket.num_chunks)

    def align_many(self, items: Sequence[AlignmentItem]) -> list[list[WordTiming]]:
        """As `ForcedAligner.align_many` (times clamped to each clip's audio)."""
        with self._on_stream():
            return self._align_many(items)

    @torch.inference_mode()
    def _align_many(self, items: Sequence[AlignmentItem]) -> list[list[WordTiming]]:
        results: list[list[WordTiming]] = [[] for _ in items]
        words = [split_words(item.text, item.language) for item in items]
        running = [index for index, item_words in enumerate(words) if item_words]
        if not running:
            return results
        clips = self.aligner.clip_features([items[index] for index in running], is_each_alone=True,
                                           words=[words[index] for index in running])
        for rows in batches_that_fit(clips, range(len(running))):
            batch = pack(clips, rows, self.aligner.tokens.audio_pad)
            bucket = smallest_bucket(batch.num_chunks, batch.num_tokens)
            if bucket is None:  # one clip beyond every bucket
                (row,) = rows
                results[running[row]] = self.aligner.align_many([items[running[row]]])[0]
                continue
            for row, timings in zip(rows, self._run(clips, rows, batch, bucket), strict=True):
                results[running[row]] = timings
        return results

    def _run(self, clips: ClipFeatures, rows: list[int], batch: HostBatch, bucket: Bucket) -> list[list[WordTiming]]:
        self._static.load(batch, bucket)
        graph = self._graphs.get(bucket)
        if graph is not None:
            graph.replay()
        else:
            self._static.classes[:bucket.num_tokens] = self.aligner.model.thinker.packed_classes(
                self._static.view(bucket))
        classes = self._read_classes(batch.num_tokens)
        timestamp = self.aligner.tokens.timestamp
        timings = []
        for row, start in zip(rows, batch.prompt_starts, strict=True):
            end = start + len(clips.prompts[row])
            stamps = classes[start:end][batch.input_ids[start:end] == timestamp].tolist()
            timings.append(self.aligner.timings(clips.words[row], stamps, clips.durations_s[row]))
        return timings

    def _read_classes(self, num_tokens: int) -> np.ndarray:
        """The classes, once the device has them: waiting on an event lets go of the GIL, a blocking copy would not."""
        host = self._static.host_classes[:num_tokens]
        host.copy_(self._static.classes[:num_tokens], non_blocking=True)
        if self._done is not None:
            self._done.record()
            self._done.synchronize()
        return host.numpy().copy()

    def _on_stream(self) -> contextlib.AbstractContextManager[object]:
        return contextlib.nullcontext() if self.stream is None else torch.cuda.stream(self.stream)

    @torch.inference_mode()
    def _capture(self) -> None:
        """One graph per bucket, all in one pool (one batch runs at a time), captured on the aligner's stream (so its
        cuBLAS workspace is its own, never one the engine's graphs use beside it)."""
        assert self.stream is not None
        thinker = self.aligner.model.thinker
        pool = torch.cuda.graph_pool_handle()
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            for bucket in reversed(BUCKETS):
                view = self._static.view(bucket)
                self._static.token_clip.fill_(-1)
                self._static.ids[2].fill_(-1)
                self._static.classes[:bucket.num_tokens] = thinker.packed_classes(view)  # warm-up, outside the graph
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=self.stream):
                    self._static.classes[:bucket.num_tokens] = thinker.packed_classes(view)
                self._graphs[bucket] = graph
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        torch.cuda.synchronize(self.device)
