"""`qwen3-tts`: speak text through a qwen3-tts server from the command line.

    qwen3-tts voices
    qwen3-tts say "Hello there." -o hello.wav            (streamed to the file as it is generated)
    qwen3-tts say "Hello there." -o hello.wav --unary    (one request, one response)
    llm ... | qwen3-tts stream -o answer.wav             (text read from stdin as it arrives)
    qwen3-tts say "Hi." -o - --encoding pcm16 | aplay -f S16_LE -r 24000

The API key may also come from the QWEN3_TTS_API_KEY environment variable.
"""

from __future__ import annotations

import argparse
import codecs
import os
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import grpc

from clients.qwen3_tts_client.client import DEFAULT_TARGET, AudioFormat, Connection, Generation, TtsClient, Voice

API_KEY_ENV = "QWEN3_TTS_API_KEY"
ENCODINGS = ("pcm16", "wav", "ogg_opus", "mulaw", "alaw")
_ENCODING_BY_SUFFIX = {".wav": "wav", ".ogg": "ogg_opus", ".opus": "ogg_opus", ".pcm": "pcm16", ".raw": "pcm16",
                       ".l16": "pcm16", ".ulaw": "mulaw", ".mulaw": "mulaw", ".alaw": "alaw"}
_STDIN_READ_BYTES = 4096


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qwen3-tts", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--server", default=DEFAULT_TARGET, help=f"host:port (default {DEFAULT_TARGET})")
    parser.add_argument("--tls", action="store_true", help="connect with TLS (system roots unless --ca)")
    parser.add_argument("--ca", type=Path, help="PEM root certificate(s) to trust (implies --tls)")
    parser.add_argument("--cert", type=Path, help="PEM client certificate chain, for mTLS (with --key)")
    parser.add_argument("--key", type=Path, help="PEM client private key, for mTLS")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV), help=f"API key (or env {API_KEY_ENV})")
    parser.add_argument("--timeout", type=float, help="seconds before the call is abandoned")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("voices", help="show the model, its speakers, languages and audio formats")
    say = commands.add_parser("say", help="speak TEXT into a file")
    say.add_argument("text")
    say.add_argument("--unary", action="store_true", help="one Synthesize call instead of streaming the audio")
    stream = commands.add_parser("stream", help="speak text read from stdin as it arrives (bidirectional streaming)")
    for command in (say, stream):
        _add_synthesis_options(command)
    return parser


def _add_synthesis_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", default="out.wav", help="output file, or - for stdout (default out.wav)")
    parser.add_argument("--speaker", default="", help="built-in speaker (CustomVoice models)")
    parser.add_argument("--language", default="", help="language of the text (default auto)")
    parser.add_argument("--instruction", default="", help="voice description or speaking style")
    parser.add_argument("--reference-audio", type=Path, help="recording of the voice to clone (Base models)")
    parser.add_argument("--reference-text", default="", help="transcript of the reference audio")
    parser.add_argument("--x-vector-only", action="store_true", help="clone from the speaker embedding alone")
    parser.add_argument("--encoding", choices=ENCODINGS, help="audio encoding (default: from the output's suffix, "
                                                              "else wav)")
    parser.add_argument("--sample-rate", type=int, default=0, help="output rate in Hz (default 24000)")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--repetition-penalty", type=float)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--max-seconds", type=float, help="most audio to generate")


def _read(path: Path | None) -> bytes | None:
    return path.read_bytes() if path is not None else None


def _connection(args: argparse.Namespace) -> Connection:
    return Connection(target=args.server, api_key=args.api_key, tls=args.tls, root_certificates=_read(args.ca),
                      private_key=_read(args.key), certificate_chain=_read(args.cert))


def _encoding(args: argparse.Namespace) -> str:
    if args.encoding:
        return args.encoding
    return _ENCODING_BY_SUFFIX.get(Path(args.output).suffix.lower(), "wav")


def _request_parts(args: argparse.Namespace) -> tuple[Voice, AudioFormat, Generation]:
    voice = Voice(speaker=args.speaker, language=args.language, instruction=args.instruction,
                  reference_audio=_read(args.reference_audio) or b"", reference_text=args.reference_text,
                  x_vector_only=args.x_vector_only)
    generation = Generation(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            repetition_penalty=args.repetition_penalty, seed=args.seed,
                            max_audio_seconds=args.max_seconds)
    return voice, AudioFormat(_encoding(args), args.sample_rate), generation


class AudioSink:
    """Writes audio as it arrives; a streamed WAV saved to a file gets its real sizes at the end."""

    def __init__(self, output: str, encoding: str) -> None:
        self._is_stdout = output == "-"
        # Readable too, for patch_wav_sizes.
        self._file: BinaryIO = sys.stdout.buffer if self._is_stdout else open(output, "w+b")  # noqa: SIM115
        self._encoding = encoding

    def write(self, data: bytes) -> None:
        if data:
            self._file.write(data)
            self._file.flush()

    def close(self, was_streamed: bool) -> None:
        if not self._is_stdout:
            if was_streamed and self._encoding == "wav":
                patch_wav_sizes(self._file)
            self._file.close()


def patch_wav_sizes(file: BinaryIO) -> None:
    """Replace a streamed WAV header's 'unknown' RIFF and data sizes with the file's real ones."""
    end = file.seek(0, os.SEEK_END)
    file.seek(0)
    header = file.read(min(end, 4096))
    data_at = header.find(b"data", 12)
    if header[:4] != b"RIFF" or data_at < 0:
        return
    file.seek(4)
    file.write(struct.pack("<I", end - 8))
    file.seek(data_at + 4)
    file.write(struct.pack("<I", end - data_at - 8))
    file.seek(end)


def stdin_fragments() -> Iterator[str]:
    """Text from stdin as soon as it arrives (not line by line), never splitting a UTF-8 character."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while chunk := os.read(sys.stdin.fileno(), _STDIN_READ_BYTES):
        text = decoder.decode(chunk)
        if text:
            yield text
    if tail := decoder.decode(b"", final=True):
        yield tail


def _report(output: str, completion: Any) -> None:
    usage = completion.usage
    reason = type(completion).DESCRIPTOR.fields_by_name["finish_reason"].enum_type.values_by_number[
        completion.finish_reason].name.removeprefix("FINISH_REASON_").lower()
    where = "stdout" if output == "-" else output
    sys.stderr.write(f"wrote {where}: {usage.audio_seconds:.2f} s of audio, {usage.audio_frames} frames, "
                     f"{usage.input_tokens} text tokens, finish reason {reason}, request {completion.request_id}\n")


def _say_or_stream(client: TtsClient, args: argparse.Namespace) -> None:
    voice, audio_format, generation = _request_parts(args)
    sink = AudioSink(args.output, audio_format.encoding)
    is_streamed = not (args.command == "say" and args.unary)
    try:
        if not is_streamed:
            response = client.synthesize(args.text, voice, audio_format, generation, timeout=args.timeout)
            sink.write(response.audio)
            completion = response.completion
        else:
            if args.command == "say":
                responses = client.synthesize_online(args.text, voice, audio_format, generation, args.timeout)
            else:
                responses = client.streaming_synthesize(stdin_fragments(), voice, audio_format, generation,
                                                        args.timeout)
            completion = None
            for response in responses:
                sink.write(response.chunk.audio)
                if response.HasField("completion"):
                    completion = response.completion
    finally:
        sink.close(is_streamed)
    if completion is not None:
        _report(args.output, completion)


def _print_voices(response: Any) -> None:
    pb_module = type(response).DESCRIPTOR.file
    mode = pb_module.enum_types_by_name["ModelMode"].values_by_number[response.mode].name
    encodings = pb_module.enum_types_by_name["AudioEncoding"]
    lines = [f"model: {response.model} ({response.model_size}, {mode.removeprefix('MODEL_MODE_').lower()})"
             + (" RANDOM WEIGHTS: noise, not speech" if response.random_weights else "")]
    if response.speakers:
        lines.append("speakers: " + ", ".join(
            speaker.name + (f" ({speaker.dialect})" if speaker.dialect else "") for speaker in response.speakers))
    lines.append("languages: " + ", ".join(response.languages))
    lines.append(f"instruction: {'yes' if response.accepts_instruction else 'no'}")
    for support in response.output_formats:
        rates = ", ".join(str(rate) for rate in support.sample_rates)
        name = encodings.values_by_number[support.encoding].name.removeprefix("AUDIO_ENCODING_").lower()
        lines.append(f"{name}: {rates} Hz ({support.mime_type})")
    limits = response.limits
    lines.append(f"limits: {limits.max_text_chars} characters, {limits.max_audio_seconds:g} s of audio per request")
    sys.stdout.write("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        with TtsClient(_connection(args)) as client:
            if args.command == "voices":
                _print_voices(client.list_voices(timeout=args.timeout))
            else:
                _say_or_stream(client, args)
    except grpc.RpcError as error:
        sys.stderr.write(f"qwen3-tts: {error.code().name}: {error.details()}\n")  # type: ignore[attr-defined]
        return 1
    except (OSError, ValueError) as error:
        sys.stderr.write(f"qwen3-tts: {error}\n")
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
