"""The forced aligner beside the engine: word timings for every request that asked, batched, on the engine's device.

It lives where the engine does (the engine core's process by default) so that it shares the engine's CUDA context:
two processes' kernels take turns on a GPU, and a turn of the aligner's held the engine's frames back (p95 first
audio 26 -> 39 ms at 20 req/s on an H100 with the aligner in the server's process; BENCHMARKS.md, "Voice agents").
In one context its kernels run beside the engine's, on a stream of its own. Windows to align queue here and are
aligned together, a batch at a time, on a thread of their own, so that many requests cost one forward pass
(replayed from captured graphs on a GPU: `tts_service.runner.aligner_runner`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from tts_service.engine.config import EngineConfig
from tts_service.model.aligner import AlignmentItem, ForcedAligner, WordTiming
from tts_service.model.checkpoint import CheckpointError, LoadedModel
from tts_service.runner.aligner_runner import AlignerRunner

logger = logging.getLogger(__name__)

# Windows aligned in one forward pass at most.
MAX_ALIGNER_BATCH = 16


def load_aligner(config: EngineConfig, model: LoadedModel) -> AlignerRunner:
    """The aligner `config.aligner_model` names, on the model's device and in its dtype, its graphs captured when
    the engine's are. Raises CheckpointError, naming the flag, when it cannot be had: a server asked for word
    timestamps does not serve without them."""
    assert config.aligner_model is not None
    dtype = model.talker.codec_head.weight.dtype
    try:
        aligner = ForcedAligner.load(config.aligner_model, model.device, dtype,
                                     max_download_wait_s=config.model_download_timeout_s)
    except (CheckpointError, ValueError, OSError) as error:
        raise CheckpointError(f"the forced aligner {config.aligner_model} (--aligner-model): {error}") from error
    runner = AlignerRunner(aligner, use_graphs=config.use_cuda_graphs, use_fused_kernels=config.use_fused_kernels)
    logger.info("forced aligner %s loaded on %s for word timestamps (%d graphs, fused kernels %s)%s", aligner.source,
                model.device, len(runner.captured_buckets), "on" if runner.is_fused else "off",
                " (RANDOM weights: the timings are noise)" if aligner.is_random else "")
    return runner


class BatchAligner(Protocol):
    """What the worker needs of an aligner (`AlignerRunner`, or a test's stand-in)."""

    source: str
    is_random: bool

    def align_many(self, items: Sequence[AlignmentItem]) -> list[list[WordTiming]]: ...


class AlignerWorker:
    """Aligns windows on one thread, every window that waits in the next batch."""

    def __init__(self, aligner: BatchAligner, max_batch: int = MAX_ALIGNER_BATCH) -> None:
        self.aligner = aligner
        self._max_batch = max_batch
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tts-aligner")
        self._pending: list[tuple[AlignmentItem, asyncio.Future[list[WordTiming]]]] = []
        self._is_running = False

    async def align(self, item: AlignmentItem) -> list[WordTiming]:
        future: asyncio.Future[list[WordTiming]] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        self._start_batch()
        return await future

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _start_batch(self) -> None:
        self._pending = [(item, future) for item, future in self._pending if not future.cancelled()]
        if self._is_running or not self._pending:
            return
        batch, self._pending = self._pending[:self._max_batch], self._pending[self._max_batch:]
        self._is_running = True
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(self._executor, self.aligner.align_many, [item for item, _ in batch])
        work.add_done_callback(lambda done: self._settle(batch, done))

    def _settle(self, batch: Sequence[tuple[AlignmentItem, asyncio.Future[list[WordTiming]]]],
                done: asyncio.Future[list[list[WordTiming]]]) -> None:
        self._is_running = False
        error = None if done.cancelled() else done.exception()
        for index, (_, future) in enumerate(batch):
            if future.done():
                continue
            if done.cancelled():
                future.cancel()
            elif error is not None:
                future.set_exception(error)
            else:
                future.set_result(done.result()[index])
        self._start_batch()
