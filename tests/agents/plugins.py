"""Drive the REAL ElevenLabs TTS plugins of Pipecat (pipecat-ai 1.14.0) and LiveKit Agents
(livekit-plugins-elevenlabs 1.8.9) against an ElevenLabs-compatible server, and report what they produced.

    PLUGIN_PYTHON plugins.py --base-url ws://127.0.0.1:PORT --voice ryan --api-key KEY

It runs in a virtual environment of its own, holding the plugins (they pin protobuf and OpenTelemetry versions
that ours do not allow), and talks to the server over its socket only: nothing of this repository is imported.
Each plugin is pointed at the server the way a user would point it:
  * Pipecat:  ElevenLabsTTSService(api_key=..., url="ws://HOST:PORT", settings=Settings(voice=..., model=...)),
              run inside pipecat.tests.utils.run_test (the package's own pipeline test driver);
  * LiveKit:  elevenlabs.TTS(api_key=..., base_url="http://HOST:PORT/v1", voice_id=..., encoding="pcm_24000",
              http_session=...).stream(); and as "livekit-mp3", with the plugin's default encoding (MP3 frames,
              mp3_22050_32, which the plugin decodes itself).
Scenarios: "turn" (one agent turn of two sentences, spoken to its end) and "interrupt" (a turn interrupted after its
first audio, then a fresh turn on the same socket). One JSON object per run is printed on its own line (plugin,
scenario, audio seconds, words with their times, errors); the exit status is 0 when every run produced audio
and no error.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import time
from typing import Any

SENTENCE_1 = "Hello there, this is the first sentence. "
SENTENCE_2 = "And here is the second one."
TURN_2 = "A fresh turn after the interruption."
SAMPLE_RATE = 24000


async def run_pipecat(args: argparse.Namespace, scenario: str) -> dict[str, Any]:
    from pipecat.frames.frames import (
        ErrorFrame,
        InterruptionFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        TTSAudioRawFrame,
        TTSTextFrame,
    )
    from pipecat.pipeline.worker import PipelineParams
    from pipecat.services.elevenlabs.tts import ElevenLabsTTSService
    from pipecat.tests.utils import SleepFrame, run_test

    tts = ElevenLabsTTSService(api_key=args.api_key, url=args.base_url, sample_rate=SAMPLE_RATE,
                               settings=ElevenLabsTTSService.Settings(voice=args.voice, model="eleven_flash_v2_5"))
    turn = [LLMFullResponseStartFrame(), LLMTextFrame(SENTENCE_1), LLMTextFrame(SENTENCE_2),
            LLMFullResponseEndFrame()]
    if scenario == "interrupt":
        turn = [LLMFullResponseStartFrame(), LLMTextFrame(SENTENCE_1), LLMTextFrame(SENTENCE_2[:12]),
                SleepFrame(sleep=0.5), InterruptionFrame(), SleepFrame(sleep=0.3),
                LLMFullResponseStartFrame(), LLMTextFrame(TURN_2), LLMFullResponseEndFrame()]
    frames = [*turn, SleepFrame(sleep=args.settle)]
    down, up = await asyncio.wait_for(run_test(tts, frames_to_send=frames, start_timeout=10.0,
                                               pipeline_params=PipelineParams(audio_out_sample_rate=SAMPLE_RATE)),
                                      args.timeout)
    num_bytes, words, errors = 0, [], []
    for frame in [*down, *up]:
        if isinstance(frame, TTSAudioRawFrame):
            num_bytes += len(frame.audio)
        elif isinstance(frame, TTSTextFrame):
            words.append({"text": frame.text, "start_s": frame.pts / 1e9 if frame.pts else None})
        elif isinstance(frame, ErrorFrame):
            errors.append(str(frame.error))
    return {"audio_seconds": num_bytes / 2 / SAMPLE_RATE, "words": words, "errors": errors}


async def run_livekit(args: argparse.Namespace, scenario: str, encoding: str | None) -> dict[str, Any]:
    import aiohttp
    from livekit.agents import APIConnectOptions
    from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT
    from livekit.plugins import elevenlabs

    http_base = args.base_url.replace("wss://", "https://").replace("ws://", "http://")
    seconds, words, errors = 0.0, [], []

    async def consume(stream: Any, stop_after_first_audio: bool = False) -> None:
        nonlocal seconds
        async for event in stream:
            seconds += event.frame.samples_per_channel / event.frame.sample_rate
            for timed in event.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, []):
                words.append({"text": str(timed), "start_s": timed.start_time, "end_s": timed.end_time})
            if stop_after_first_audio and seconds:
                return

    async with aiohttp.ClientSession() as session:
        chosen = {} if encoding is None else {"encoding": encoding}
        tts = elevenlabs.TTS(api_key=args.api_key, base_url=f"{http_base}/v1", voice_id=args.voice,
                             model="eleven_flash_v2_5", http_session=session, **chosen)
        options = APIConnectOptions(max_retry=0, timeout=args.timeout)
        try:
            texts = [SENTENCE_1, SENTENCE_2] if scenario == "turn" else [SENTENCE_1, SENTENCE_2[:12]]
            stream = tts.stream(conn_options=options)
            for text in texts:
                stream.push_text(text)
            if scenario == "turn":
                stream.end_input()
            await asyncio.wait_for(consume(stream, stop_after_first_audio=scenario == "interrupt"), args.timeout)
            await stream.aclose()  # after its first audio: what AgentSession does on a barge-in
            if scenario == "interrupt":
                stream = tts.stream(conn_options=options)
                stream.push_text(TURN_2)
                stream.end_input()
                await asyncio.wait_for(consume(stream), args.timeout)
                await stream.aclose()
        except Exception as error:  # reported, so that the other runs still run
            errors.append(f"{type(error).__name__}: {error}")
        finally:
            await tts.aclose()
    return {"audio_seconds": seconds, "words": words, "errors": errors}


async def main(args: argparse.Namespace) -> int:
    succeeded = True
    runs = (("pipecat", run_pipecat),
            ("livekit", functools.partial(run_livekit, encoding=f"pcm_{SAMPLE_RATE}")),
            ("livekit-mp3", functools.partial(run_livekit, encoding=None)))
    for plugin, run in runs:
        for scenario in ("turn", "interrupt"):
            started = time.monotonic()
            try:
                result = await run(args, scenario)
            except Exception as error:  # reported as this run's failure
                result = {"audio_seconds": 0.0, "words": [], "errors": [f"{type(error).__name__}: {error}"]}
            result = {"plugin": plugin, "scenario": scenario, "elapsed_s": round(time.monotonic() - started, 2),
                      **result}
            succeeded &= result["audio_seconds"] > 0 and not result["errors"]
            sys.stdout.write(json.dumps(result) + "\n")
            sys.stdout.flush()
    return 0 if succeeded else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True, help="ws://HOST:PORT of the server")
    parser.add_argument("--api-key", default="test-key")
    parser.add_argument("--voice", default="ryan")
    parser.add_argument("--settle", type=float, default=1.5, help="Pipecat: seconds to wait for audio at the end")
    parser.add_argument("--timeout", type=float, default=60.0)
    sys.exit(asyncio.run(main(parser.parse_args())))
