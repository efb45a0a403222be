"""`qwen3-tts voice create|get|list|delete`: registered voices from the command line.

    VOICE=$(qwen3-tts voice create --reference-audio me.wav --reference-text "What I said.")
    qwen3-tts say "Hello in my voice." --voice-id "$VOICE" -o hello.wav
    qwen3-tts voice list
    qwen3-tts voice delete "$VOICE"

`create` prints the new voice's id alone, for scripts; `get` and `list` print one line per voice.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import UTC
from typing import Any

from clients.qwen3_tts_client.client import TtsClient, VoiceReference

_PCM16_RATE_HELP = "the rate of a raw PCM16 (headerless, 16-bit little-endian mono) reference; unset: a file"


def add_voice_commands(commands: Any, file_contents: Callable[[str], bytes]) -> None:
    voice = commands.add_parser("voice", help="create, get, list or delete registered voices (Base models)",
                                description=__doc__.split("\n\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = voice.add_subparsers(dest="voice_command", required=True)
    create = actions.add_parser("create", help="clone a voice from a recording and store it; prints its id")
    create.add_argument("--reference-audio", type=file_contents, required=True, help="recording of the voice")
    create.add_argument("--reference-text", default="", help="its transcript (needed unless --x-vector-only)")
    create.add_argument("--x-vector-only", action="store_true", help="store the speaker embedding alone")
    create.add_argument("--pcm16-rate", type=int, default=0, help=_PCM16_RATE_HELP)
    for name, help_text in (("get", "show one voice"), ("delete", "forget one voice")):
        action = actions.add_parser(name, help=help_text)
        action.add_argument("voice_id")
    actions.add_parser("list", help="show your voices, oldest first")


def run_voice_command(client: TtsClient, args: argparse.Namespace) -> None:
    command = args.voice_command
    if command == "create":
        reference = VoiceReference(audio=args.reference_audio, text=args.reference_text,
                                   x_vector_only=args.x_vector_only, pcm16_rate=args.pcm16_rate)
        sys.stdout.write(client.create_voice(reference, timeout=args.timeout).voice_id + "\n")
    elif command == "get":
        sys.stdout.write(describe_voice(client.get_voice(args.voice_id, timeout=args.timeout)) + "\n")
    elif command == "delete":
        client.delete_voice(args.voice_id, timeout=args.timeout)
    else:
        voices = client.list_voices(timeout=args.timeout).registered_voices
        sys.stdout.write("".join(describe_voice(voice) + "\n" for voice in voices))


def describe_voice(voice: Any) -> str:
    """One line: id, kind, reference length, creation time (UTC) and, for an in-context voice, the transcript."""
    kind = type(voice).DESCRIPTOR.fields_by_name["kind"].enum_type.values_by_number[voice.kind].name
    created = voice.create_time.ToDatetime(tzinfo=UTC).isoformat(timespec="seconds")
    line = f"{voice.voice_id}  {kind.removeprefix('VOICE_KIND_').lower()}  {voice.reference_seconds:.2f} s  {created}"
    return line + (f"  {voice.reference_text!r}" if voice.reference_text else "")
