"""What crosses between the server's process and the core's: the server's messages of one turn of its event loop go
out in one write, in order, each read back whole; once the other process has gone, what is pending is dropped."""

from __future__ import annotations

import asyncio
import socket

from tts_service.engine.wire import Call, Notice, Sender, Stop, receive


def test_the_messages_of_one_turn_of_the_loop_go_out_in_one_write_and_are_read_back_in_order() -> None:
    async def run() -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        _, writer = await asyncio.open_unix_connection(sock=ours)
        reader, their_writer = await asyncio.open_unix_connection(sock=theirs)
        writes: list[bytes] = []
        write = writer.write
        writer.write = lambda data: (writes.append(data), write(data))[1]  # type: ignore[method-assign]
        sender = Sender(writer)
        messages = [Call(0, "submit", ("first",)), Notice("append_text", ("first", "Hello ")),
                    Notice("append_text", ("first", "there.")), Notice("close_text", ("first",))]
        for message in messages:
            sender.send(message)
        assert writes == []  # nothing before the turn ends
        assert [await receive(reader) for _ in messages] == messages
        assert len(writes) == 1
        sender.send(Stop())  # a later turn: a write of its own
        assert await receive(reader) == Stop()
        assert len(writes) == 2
        writer.close()
        their_writer.close()

    asyncio.run(run())


def test_what_is_pending_when_the_other_process_has_gone_is_dropped_without_a_write() -> None:
    async def run() -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        theirs.close()
        _, writer = await asyncio.open_unix_connection(sock=ours)
        writes: list[bytes] = []
        writer.write = writes.append  # type: ignore[method-assign]
        sender = Sender(writer)
        sender.send(Notice("abort", ("gone",)))
        writer.close()  # as EngineProcess does once the core has gone
        await asyncio.sleep(0)  # the turn's flush
        assert writes == []

    asyncio.run(run())
