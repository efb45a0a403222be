"""Log records carry the request and trace ids of the call that logged them, and no other call's."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator

import pytest

from observability.logs import CallIdsFilter, JsonFormatter, bind_call


class Collected(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.addFilter(CallIdsFilter())
        self.setFormatter(JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def collected() -> Iterator[tuple[logging.Logger, Collected]]:
    logger = logging.getLogger("tests.logs")
    logger.setLevel(logging.INFO)
    handler = Collected()
    logger.addHandler(handler)
    yield logger, handler
    logger.removeHandler(handler)


def test_concurrent_calls_each_tag_their_own_records(collected: tuple[logging.Logger, Collected]) -> None:
    logger, handler = collected

    async def call(request_id: str, trace_id: str) -> None:
        bind_call(request_id, trace_id)
        for step in range(3):
            logger.info("%s step %d", request_id, step)
            await asyncio.sleep(0)  # interleave with the other call

        async def helper() -> None:  # a task the call starts inherits its ids
            logger.info("%s helper", request_id)

        await asyncio.create_task(helper())

    async def both() -> None:
        await asyncio.gather(call("a" * 32, "1" * 32), call("b" * 32, "2" * 32))

    asyncio.run(both())
    records = [json.loads(line) for line in handler.lines]
    assert len(records) == 8
    for record in records:
        expected_trace = "1" * 32 if record["request_id"] == "a" * 32 else "2" * 32
        assert record["message"].startswith(record["request_id"])
        assert record["trace_id"] == expected_trace


def test_records_outside_a_call_carry_no_ids_and_exceptions_are_kept(
        collected: tuple[logging.Logger, Collected]) -> None:
    logger, handler = collected

    async def outside() -> None:
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("engine trouble")

    asyncio.run(outside())
    record = json.loads(handler.lines[-1])
    assert "request_id" not in record and "trace_id" not in record
    assert record["level"] == "ERROR" and "ValueError: boom" in record["exception"]
