"""The aligner beside the engine: windows that wait while a batch runs are aligned together in the next one, and an
engine without an aligner refuses to time words, naming the flag."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from tts_service.engine.aligner_worker import AlignerWorker
from tts_service.engine.config import EngineConfig
from tts_service.engine.engine import Engine
from tts_service.model.aligner import AlignmentItem, WordTiming
from tts_service.model.checkpoint import CheckpointError
from tts_service.model.prompts import PromptError

ONE_WORD = [WordTiming(0, 1, 0.0, 0.08)]


class CountingAligner:
    source = "counting"
    is_random = True
    device = torch.device("cpu")

    def __init__(self) -> None:
        self.batches: list[int] = []

    def align_many(self, items: Sequence[AlignmentItem]) -> list[list[WordTiming]]:
        self.batches.append(len(items))
        return [list(ONE_WORD) for _ in items]


class FailingAligner(CountingAligner):
    def align_many(self, items: Sequence[AlignmentItem]) -> list[list[WordTiming]]:
        raise ValueError("audio holds NaN or infinite samples")


ITEM = AlignmentItem(np.zeros(1600, dtype=np.float32), 16000, "a")


def test_windows_that_wait_are_aligned_together_in_one_batch() -> None:
    counting = CountingAligner()
    worker = AlignerWorker(counting, max_batch=8)

    async def scenario() -> list[list[WordTiming]]:
        return await asyncio.gather(*(worker.align(ITEM) for _ in range(10)))

    try:
        results = asyncio.run(scenario())
    finally:
        worker.close()
    assert results == [ONE_WORD] * 10
    assert counting.batches[0] == 1 and sum(counting.batches) == 10 and max(counting.batches) <= 8
    assert len(counting.batches) <= 3


def test_a_failed_batch_fails_each_of_its_windows_and_the_next_batch_still_runs() -> None:
    worker = AlignerWorker(FailingAligner())

    async def scenario() -> list[object]:
        return await asyncio.gather(*(worker.align(ITEM) for _ in range(3)), return_exceptions=True)

    try:
        results = asyncio.run(scenario())
    finally:
        worker.close()
    assert len(results) == 3 and all(isinstance(result, ValueError) for result in results)


def test_a_cancelled_window_is_left_out_of_the_next_batch() -> None:
    counting = CountingAligner()
    worker = AlignerWorker(counting)

    async def scenario() -> list[list[WordTiming]]:
        first = asyncio.ensure_future(worker.align(ITEM))
        await asyncio.sleep(0)  # the first batch (one window) is running
        dropped = asyncio.ensure_future(worker.align(ITEM))
        kept = asyncio.ensure_future(worker.align(ITEM))
        await asyncio.sleep(0)
        dropped.cancel()
        return [await first, await kept]

    try:
        results = asyncio.run(scenario())
    finally:
        worker.close()
    assert results == [ONE_WORD, ONE_WORD]
    assert counting.batches == [1, 1]


def test_an_engine_with_an_aligner_times_words_on_its_device_and_says_which_aligner_it_has(tiny_models) -> None:
    config = EngineConfig(max_running=2, num_slots=2, block_size=4, num_kv_blocks=64, max_positions_per_request=256,
                          aligner_model="random:tiny")
    engine = Engine.create(tiny_models["custom_voice"], config)

    async def scenario() -> list[list[WordTiming]]:
        clip = AlignmentItem(np.random.default_rng(0).standard_normal(24000).astype(np.float32) * 0.1, 24000,
                             "two words")
        return await asyncio.gather(engine.align_words(clip), engine.align_words(clip))

    try:
        first, second = asyncio.run(scenario())
    finally:
        asyncio.run(engine.stop())
    assert engine.model_info.aligner == "random:tiny"
    assert [(word.start_char, word.end_char) for word in first] == [(0, 3), (4, 9)]
    assert first == second and all(0.0 <= word.start_s <= word.end_s <= 1.0 for word in first)


def test_an_engine_without_an_aligner_refuses_to_time_words_naming_the_flag(tiny_models) -> None:
    config = EngineConfig(max_running=2, num_slots=2, block_size=4, num_kv_blocks=64, max_positions_per_request=256)
    engine = Engine.create(tiny_models["custom_voice"], config)
    try:
        with pytest.raises(PromptError, match="--aligner-model"):
            asyncio.run(engine.align_words(ITEM))
    finally:
        asyncio.run(engine.stop())
    assert engine.model_info.aligner is None


def test_an_aligner_that_cannot_be_had_fails_the_engine_naming_the_flag(tiny_models, tmp_path) -> None:
    config = EngineConfig(max_running=2, num_slots=2, block_size=4, num_kv_blocks=64, max_positions_per_request=256,
                          aligner_model=str(tmp_path / "absent"))
    with pytest.raises(CheckpointError, match="--aligner-model"):
        Engine.create(tiny_models["custom_voice"], config)
