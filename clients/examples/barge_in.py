"""An agent loop with barge-in: an LLM's answers spoken turn after turn as utterances of ONE StreamingSynthesize
call; when the user starts speaking mid-turn, that turn is cancelled, the agent learns which words the listener
actually heard, and it goes on with the next turn.

    qwen3-tts-server --model random:tiny-custom_voice --aligner-model random:tiny
    python -m clients.examples.barge_in --server localhost:50051

The LLM, the loudspeaker and the user are simulated: tokens come from a generator, a Player "plays" the audio in
real time as it arrives, and the user speaks once a turn has played for a set time. A word was heard when its audio
ended before playback stopped. Timings trail the audio by about a sentence, so the words of the sentence being cut
may not be timed yet: those count as not heard (the random test aligner times words only at a turn's end).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from clients.qwen3_tts_client import AsyncTtsClient, AudioFormat, Connection, Voice, tts_pb2
from clients.qwen3_tts_client.client import CancelUtterance, CloseUtterance, Say, StreamItem

VOICE = Voice(speaker="ryan", language="english")
Requests = asyncio.Queue[StreamItem | None]  # what the agent sends on the call; None ends it


@dataclass(frozen=True)
class Turn:
    text: str
    barge_in_after_s: float | None = None  # the user starts speaking once this much of the turn has played


TURNS = (Turn("Sure. The weather today is sunny, with a light breeze from the west."),
         Turn("Tomorrow brings rain in the morning. Then it clears up, and the evening is mild and dry.", 1.0),
         Turn("Of course. Here is the forecast for Sunday instead."))


@dataclass(frozen=True)
class TurnReport:
    turn_id: str
    finish_reason: str  # stopped or length (spoken to its end), or cancelled (barged in)
    heard_seconds: float
    heard_words: tuple[str, ...]


class Player:
    """A simulated loudspeaker: starts with the first audio, plays `speed` seconds of audio a second, stalls when
    it runs out of audio, and stops for good when the user barges in."""

    def __init__(self, speed: float = 1.0) -> None:
        self.speed, self.received_s, self.stopped = speed, 0.0, False
        self._played_s, self._clock = 0.0, 0.0  # played so far, as of the monotonic time _clock (0: no audio yet)

    def receive(self, seconds: float) -> None:
        self._clock = self._clock or time.monotonic()
        self.played_s()  # the audio before this one is what has been playing until now
        self.received_s += seconds

    def played_s(self) -> float:
        if self._clock and not self.stopped:
            now = time.monotonic()
            self._played_s = min(self.received_s, self._played_s + (now - self._clock) * self.speed)
            self._clock = now
        return self._played_s

    def stop(self) -> float:
        played, self.stopped = self.played_s(), True
        return played


@dataclass
class Utterance:
    player: Player
    words: list[Any] = field(default_factory=list)  # WordTiming messages, in order
    completion: asyncio.Future[Any] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


async def llm_tokens(text: str) -> AsyncIterator[str]:
    """A stand-in for an LLM: the answer a word or so at a time, spaces kept, as a model streams them."""
    for token in re.findall(r"\S+\s*", text):
        await asyncio.sleep(0.03)
        yield token


async def queued(requests: Requests) -> AsyncIterator[StreamItem]:
    while (item := await requests.get()) is not None:
        yield item


async def read_responses(call: Any, utterances: dict[str, Utterance]) -> None:
    """Route every response to its utterance: audio to its player, words to its list, completion to its future."""
    try:
        async for response in call:
            utterance = utterances[response.utterance_id]
            if response.HasField("chunk"):
                utterance.player.receive(response.chunk.duration_seconds)
            utterance.words += response.words.words
            if response.HasField("completion"):
                utterance.completion.set_result(response.completion)
    except Exception as error:  # the call failed: no turn waiting on it may hang
        for utterance in utterances.values():
            if not utterance.completion.done():
                utterance.completion.set_exception(error)
        raise


async def send_tokens(turn_id: str, text: str, requests: Requests) -> None:
    async for token in llm_tokens(text):
        await requests.put(Say(turn_id, token))
    await requests.put(CloseUtterance(turn_id))


async def until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.02)


async def speak(turn_id: str, turn: Turn, utterance: Utterance, requests: Requests) -> TurnReport:
    """Stream one turn's tokens; the turn ends once played to its end, or as soon as the user barges in."""
    player, barge_in_s = utterance.player, turn.barge_in_after_s
    llm = asyncio.create_task(send_tokens(turn_id, turn.text, requests))
    played_out = asyncio.create_task(until(lambda: utterance.completion.done() and
                                           player.played_s() >= player.received_s))
    user_spoke = asyncio.create_task(until(lambda: barge_in_s is not None and player.played_s() >= barge_in_s))
    await asyncio.wait([played_out, user_spoke], return_when=asyncio.FIRST_COMPLETED)
    heard_s = player.stop()  # the user spoke or the turn ended: either way the loudspeaker stops here
    if user_spoke.done():
        llm.cancel()  # the agent stops its LLM too
        if not utterance.completion.done():  # a turn already generated in full has nothing left to stop
            await requests.put(CancelUtterance(turn_id))
    for task in (played_out, user_spoke):
        task.cancel()
    completion = await utterance.completion
    await asyncio.gather(llm, return_exceptions=True)
    reason = tts_pb2.FinishReason.Name(completion.finish_reason).removeprefix("FINISH_REASON_").lower()
    heard = tuple(word.word for word in utterance.words if word.end_seconds <= heard_s + 1e-6)
    return TurnReport(turn_id, reason, heard_s, heard)


async def main(target: str, turns: tuple[Turn, ...] = TURNS, speed: float = 1.0) -> list[TurnReport]:
    """Speak `turns` on one call, printing and returning what the listener heard of each."""
    turn_ids = [f"turn-{number}" for number in range(1, len(turns) + 1)]
    utterances = {turn_id: Utterance(Player(speed)) for turn_id in turn_ids}
    requests: Requests = asyncio.Queue()
    reports = []
    async with AsyncTtsClient(Connection(target=target)) as tts:
        # The config opens the first turn, so that its voice prompt is ready before its first token arrives.
        call = tts.streaming_synthesize(queued(requests), VOICE, AudioFormat("pcm16"), utterance_id=turn_ids[0],
                                        word_timestamps=True)
        reader = asyncio.create_task(read_responses(call, utterances))
        for turn_id, turn in zip(turn_ids, turns, strict=True):
            report = await speak(turn_id, turn, utterances[turn_id], requests)
            print(f"{turn_id}: {report.finish_reason}, {report.heard_seconds:.2f} s played; heard: "
                  f"{' '.join(report.heard_words) or '(no word timed by then)'}")
            reports.append(report)
        await requests.put(None)  # every turn has completed: end the call
        await reader
    return reports


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="localhost:50051", help="host:port of the qwen3-tts server")
    asyncio.run(main(parser.parse_args().server))
