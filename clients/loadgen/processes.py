"""One open-loop schedule shared out over worker processes (`--processes N`), for rates that one Python process cannot
send and read: a client's event loop saturates long before a server with several GPUs does, and its lag would pass
for the server's.

Worker k of N sends every Nth planned request from the k-th, each at its planned time on the one clock all of them
read (CLOCK_MONOTONIC, the host's; asyncio's loop clock). The clock starts once every worker has its channel up,
so that no worker's connecting counts as lag. The records come back whole and the parent summarizes them as one run.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.process
import time
from multiprocessing.connection import Connection as PipeEnd
from multiprocessing.connection import wait
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Barrier

from clients.loadgen.run import RequestRecord, RequestSettings, run_schedule
from clients.loadgen.schedule import PlannedRequest
from clients.qwen3_tts_client import AsyncTtsClient, Connection

# How long a worker may take to start and connect before the run is given up.
_START_TIMEOUT_S = 120.0
# Between the last worker's connecting and the schedule's time zero: every worker is waiting by then.
_START_MARGIN_S = 0.25


class WorkerFailed(RuntimeError):
    """A worker process ended, or never became ready, without sending its records back."""


def run_schedule_in_processes(connection: Connection, planned: list[PlannedRequest], settings: RequestSettings,
                              num_processes: int) -> list[RequestRecord]:
    """The records of every planned request, in plan order, sent by `num_processes` worker processes."""
    context = multiprocessing.get_context("spawn")
    ready, go = context.Barrier(num_processes + 1), context.Barrier(num_processes + 1)
    start_at = context.Value("d", 0.0)
    workers: dict[PipeEnd, multiprocessing.process.BaseProcess] = {}
    for first in range(num_processes):
        receive, send = context.Pipe(duplex=False)
        workers[receive] = context.Process(
            target=_work, args=(connection, planned[first::num_processes], settings, ready, go, start_at, send),
            name=f"loadgen-worker-{first}", daemon=True)
    for worker in workers.values():
        worker.start()
    try:
        ready.wait(_START_TIMEOUT_S)
        start_at.value = time.monotonic() + _START_MARGIN_S
        go.wait(_START_TIMEOUT_S)
        last_start_s = max((request.start_s for request in planned), default=0.0)
        records = _collect(workers, time.monotonic() + _START_MARGIN_S + last_start_s + settings.timeout_s
                           + _START_TIMEOUT_S)
    finally:
        for worker in workers.values():
            if worker.is_alive():
                worker.kill()
            worker.join()
    return sorted(records, key=lambda record: record.index)


def _collect(workers: dict[PipeEnd, multiprocessing.process.BaseProcess], deadline: float) -> list[RequestRecord]:
    """Every worker's records, as each sends them; WorkerFailed for a worker that ends without sending, or once
    `deadline` (on the monotonic clock) passes."""
    pending = dict(workers)
    records: list[RequestRecord] = []
    while pending:
        woken = wait([*pending, *(worker.sentinel for worker in pending.values())],
                     timeout=max(0.0, deadline - time.monotonic()))
        if not woken:
            raise WorkerFailed(f"{len(pending)} load generator worker(s) outlived the run's bound")
        for receive in [receive for receive in pending if receive in woken or receive.poll()]:
            records += receive.recv()
            del pending[receive]
        dead = [worker.name for worker in pending.values() if worker.sentinel in woken]
        if dead:
            raise WorkerFailed(f"load generator worker(s) {', '.join(dead)} ended without their records")
    return records


def _work(connection: Connection, planned: list[PlannedRequest], settings: RequestSettings, ready: Barrier,
          go: Barrier, start_at: Synchronized[float], send: PipeEnd) -> None:
    send.send(asyncio.run(_send(connection, planned, settings, ready, go, start_at)))


async def _send(connection: Connection, planned: list[PlannedRequest], settings: RequestSettings, ready: Barrier,
                go: Barrier, start_at: Synchronized[float]) -> list[RequestRecord]:
    async with AsyncTtsClient(connection) as client:
        await client.list_voices(timeout=settings.timeout_s)  # the channel is up before the clock starts
        await asyncio.to_thread(ready.wait, _START_TIMEOUT_S)
        await asyncio.to_thread(go.wait, _START_TIMEOUT_S)
        return await run_schedule(client, planned, settings, start_at=start_at.value)
