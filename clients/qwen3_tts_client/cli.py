"""`qwen3-tts`: speak text through a qwen3-tts server from the command line.

    qwen3-tts voices
    qwen3-tts say "Hello there." -o hello.wav            (streamed to the file as it is generated)
    qwen3-tts say "Hello there." -o hello.flac --unary   (one request, one response)
    qwen3-tts say --file chapter.txt -o chapter.mp3       (a whole document, with a progress bar)
    llm ... | qwen3-tts stream -o answer.ogg             (text read from stdin as it arrives)
    qwen3-tts say "Hi." -o - | aplay                     (WAV to a pipe as it is generated)
    qwen3-tts say "Hi." -o - --encoding pcm16 | aplay -f S16_LE -r 24000
    qwen3-tts voice create --reference-audio me.wav --reference-text "What I said."   (prints a voice id)
    qwen3-tts say "Hi." --voice-id voice_... -o hi.wav    (see `qwen3-tts voice --help`)
    qwen3-tts say "Hello there." -o hello.wav --timestamps                 (each word's timing to stderr)
    llm ... | qwen3-tts stream -o a.wav --timestamps-out words.jsonl       (as JSON lines, as they arrive)

-o/--output FILE: the suffix picks the format: .wav; .flac; .ogg or .opus (Ogg/Opus, at 8, 16, 24 or
48 kHz); .mp3 where this libsndfile can encode MP3; .pcm, .raw or .l16 (headerless PCM16, little-endian);
.ulaw or .mulaw and .alaw (headerless G.711). Any other suffix is refused before the server is called.
The audio goes to a temporary file beside FILE, which replaces FILE only once the call has succeeded:
a failed call leaves an existing FILE as it was.

-o - (stdout), a pipe, a FIFO or a device: the audio is written as it arrives, never seeked back into:
WAV whose header says "unknown length" (players and libsndfile read it), or the --encoding given
(pcm16: raw samples, signed 16-bit little-endian, no header). A pipe or FIFO whose name has one of the
suffixes above gets that format, except .flac and .mp3, which need a file.

--timestamps (say, stream): the server (started with --aligner-model) says when each word is spoken; each
word's timing is printed to stderr as it arrives, a sentence or so behind the audio, or with --timestamps-out
FILE written to FILE (- for stdout, when the audio goes elsewhere) as JSON lines: {"word", "start_char",
"end_char", "start_seconds", "end_seconds"}, character offsets into the text sent, seconds from the audio's
first sample. The audio is the same with or without them.

--file FILE (say; - for stdin): the text of a document, spoken in one request however long (up to the server's
--max-document-chars; it speaks it segment by segment as one stream). On a terminal, a progress bar shows the
audio received against the audio the text should take, the real-time factor and the time left.

Errors name the flag or the request field at fault. Exit status: 1 when the call failed (refused by
the server, server unreachable, deadline passed), 2 for a bad argument or output, 130 on Ctrl-C.

The API key may also come from the QWEN3_TTS_API_KEY environment variable.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import enum
import json
import os
import stat
import struct
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import grpc
import numpy as np
import soundfile as sf
from tqdm import tqdm

from clients.qwen3_tts_client.client import DEFAULT_TARGET, AudioFormat, Connection, Generation, TtsClient, Voice
from clients.qwen3_tts_client.voice_commands import add_voice_commands, describe_voice, run_voice_command

API_KEY_ENV = "QWEN3_TTS_API_KEY"
ENCODINGS = ("pcm16", "wav", "ogg_opus", "mulaw", "alaw")
_OUTPUT_FLAG = "-o/--output"
_TIMESTAMPS_OUT_FLAG = "--timestamps-out"
_STDIN_READ_BYTES = 4096
_STDOUT_FD = 1
_UINT32_MAX = 2**32 - 1
# The API's default rate, asked for explicitly so that the CLI knows the rate of the PCM16 it encodes itself.
_DEFAULT_SAMPLE_RATE = 24000


class CliError(Exception):
    """A bad argument or output, reported with the flag that names it."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")


@dataclass(frozen=True)
class OutputFormat:
    """What the output holds: the encoding the server sends and, for a format the server does not produce,
    the libsndfile format the CLI encodes the server's PCM16 into."""

    encoding: str
    soundfile_format: str | None = None


_SERVER_FORMATS = {encoding: OutputFormat(encoding) for encoding in ENCODINGS}
_FORMATS_BY_SUFFIX = {
    ".wav": _SERVER_FORMATS["wav"], ".flac": OutputFormat("pcm16", "FLAC"),
    ".ogg": _SERVER_FORMATS["ogg_opus"], ".opus": _SERVER_FORMATS["ogg_opus"],
    # Only where libsndfile can encode MP3 (1.1+, built with LAME): offered elsewhere, it would fail mid-call.
    **({".mp3": OutputFormat("pcm16", "MP3")} if "MP3" in sf.available_formats() else {}),
    ".pcm": _SERVER_FORMATS["pcm16"], ".raw": _SERVER_FORMATS["pcm16"], ".l16": _SERVER_FORMATS["pcm16"],
    ".ulaw": _SERVER_FORMATS["mulaw"], ".mulaw": _SERVER_FORMATS["mulaw"], ".alaw": _SERVER_FORMATS["alaw"],
}


def _whole_number(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        refusal = argparse.ArgumentTypeError(f"must be a whole number from {low} to {high}, got {text!r}")
        try:
            value = int(text)
        except ValueError:
            raise refusal from None
        if not low <= value <= high:
            raise refusal
        return value

    return parse


def _seconds(text: str) -> float:
    refusal = argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    try:
        value = float(text)
    except ValueError:
        raise refusal from None
    if not 0 < value < float("inf"):
        raise refusal
    return value


def _server_address(text: str) -> str:
    # grpc would log its own error for an empty target before the call fails without naming the flag.
    if not text.strip():
        raise argparse.ArgumentTypeError("must be host:port, got an empty string")
    return text


def _file_contents(text: str) -> bytes:
    try:
        return Path(text).read_bytes()
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot read {text!r}: {error.strerror or error}") from None


def _text_file(text: str) -> str:
    """A document's text (UTF-8), from a file or, for -, stdin."""
    try:
        if text == "-":
            return sys.stdin.buffer.read().decode("utf-8")
        return Path(text).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise argparse.ArgumentTypeError(f"{text} is not UTF-8 text: {error.reason} at byte {error.start}") from None
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {error.strerror}") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qwen3-tts", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--server", type=_server_address, default=DEFAULT_TARGET,
                        help=f"host:port (default {DEFAULT_TARGET})")
    parser.add_argument("--tls", action="store_true", help="connect with TLS (system roots unless --ca)")
    parser.add_argument("--ca", type=_file_contents, help="PEM root certificate(s) to trust (implies --tls)")
    parser.add_argument("--cert", type=_file_contents, help="PEM client certificate chain, for mTLS (with --key)")
    parser.add_argument("--key", type=_file_contents, help="PEM client private key, for mTLS (with --cert)")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV), help=f"API key (or env {API_KEY_ENV})")
    parser.add_argument("--timeout", type=_seconds, help="seconds before the call is abandoned")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("voices", help="show the model, its speakers, languages and audio formats")
    say = commands.add_parser("say", help="speak TEXT (or --file) into a file")
    source = say.add_mutually_exclusive_group(required=True)
    source.add_argument("text", nargs="?")
    source.add_argument("--file", type=_text_file,
                        help="speak this file's text (- for stdin), with a progress bar on a terminal")
    say.add_argument("--unary", action="store_true", help="one Synthesize call instead of streaming the audio")
    stream = commands.add_parser("stream", help="speak text read from stdin as it arrives (bidirectional streaming)")
    for command in (say, stream):
        _add_synthesis_options(command)
    add_voice_commands(commands, _file_contents)
    return parser


def _add_synthesis_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", default="out.wav",
                        help=f"output file, its format picked by its suffix ({' '.join(_FORMATS_BY_SUFFIX)}), "
                             "or - for stdout, which, like a pipe, gets the audio as it arrives: WAV with an "
                             "'unknown length' header unless --encoding says otherwise (default out.wav)")
    parser.add_argument("--speaker", default="", help="built-in speaker (CustomVoice models)")
    parser.add_argument("--language", default="", help="language of the text (default auto)")
    parser.add_argument("--instruction", default="", help="voice description or speaking style")
    parser.add_argument("--reference-audio", type=_file_contents,
                        help="recording of the voice to clone (Base models)")
    parser.add_argument("--reference-text", default="", help="transcript of the reference audio")
    parser.add_argument("--x-vector-only", action="store_true", help="clone from the speaker embedding alone")
    parser.add_argument("--voice-id", default="", help="a registered voice (qwen3-tts voice create), instead of "
                                                      "--reference-audio")
    parser.add_argument("--encoding", choices=ENCODINGS,
                        help="encoding for stdout or a pipe (default wav; pcm16 is raw samples); a file's suffix "
                             "decides its own, which --encoding may only repeat")
    parser.add_argument("--sample-rate", type=_whole_number(1, _UINT32_MAX), default=_DEFAULT_SAMPLE_RATE,
                        help=f"output rate in Hz (default {_DEFAULT_SAMPLE_RATE})")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-k", type=_whole_number(0, _UINT32_MAX))
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--repetition-penalty", type=float)
    parser.add_argument("--seed", type=_whole_number(0, _UINT32_MAX))
    parser.add_argument("--max-seconds", type=float, help="most audio to generate")
    parser.add_argument("--timestamps", action="store_true",
                        help="print when each word is spoken to stderr, as the timings arrive (needs a server "
                             "started with --aligner-model)")
    parser.add_argument(_TIMESTAMPS_OUT_FLAG, metavar="FILE",
                        help="write the word timings to FILE instead, as JSON lines (- for stdout when the audio "
                             "goes elsewhere); implies --timestamps")


def _connection(args: argparse.Namespace) -> Connection:
    return Connection(target=args.server, api_key=args.api_key, tls=args.tls, root_certificates=args.ca,
                      private_key=args.key, certificate_chain=args.cert)


def _request_parts(args: argparse.Namespace, encoding: str) -> tuple[Voice, AudioFormat, Generation]:
    voice = Voice(speaker=args.speaker, language=args.language, instruction=args.instruction,
                  reference_audio=args.reference_audio or b"", reference_text=args.reference_text,
                  x_vector_only=args.x_vector_only, voice_id=args.voice_id)
    generation = Generation(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            repetition_penalty=args.repetition_penalty, seed=args.seed,
                            max_audio_seconds=args.max_seconds)
    return voice, AudioFormat(encoding, args.sample_rate), generation


class _Kind(enum.Enum):
    STDOUT = "stdout"  # -, or a path to what stdout already is (/dev/stdout): keeps the shell's redirection as it is
    STREAM = "stream"  # a pipe, a FIFO or a device: takes the audio as it comes and cannot be rewound
    FILE = "file"  # a regular file, or a new one


def _output_kind(output: str) -> _Kind:
    if output == "-":
        return _Kind.STDOUT
    try:
        status = os.stat(output)
    except OSError:  # a new file: creating it says why if it cannot be written
        return _Kind.FILE
    if _is_stdout(status):
        return _Kind.STDOUT
    return _Kind.FILE if stat.S_ISREG(status.st_mode) else _Kind.STREAM


def _is_stdout(status: os.stat_result) -> bool:
    try:
        return os.path.samestat(status, os.fstat(_STDOUT_FD))
    except OSError:  # stdout is closed
        return False


def _output_format(output: str, encoding: str | None, kind: _Kind) -> OutputFormat:
    """The output's format from its suffix (stdout and pipes: from --encoding), refused before any call."""
    suffix = "" if output == "-" else Path(output).suffix.lower()
    chosen = _FORMATS_BY_SUFFIX.get(suffix)
    if chosen is None:
        if kind is _Kind.FILE:
            raise CliError(_OUTPUT_FLAG, f"cannot write {output!r}: a file's suffix picks its format, one of "
                                        f"{' '.join(_FORMATS_BY_SUFFIX)}; or - for stdout")
        return _SERVER_FORMATS[encoding or "wav"]
    if encoding is not None and (encoding != chosen.encoding or chosen.soundfile_format is not None):
        raise CliError("--encoding", f"{encoding} contradicts {_OUTPUT_FLAG} {output!r}, whose suffix picks its "
                                     "format; leave --encoding out")
    if kind is not _Kind.FILE and chosen.soundfile_format is not None:
        raise CliError(_OUTPUT_FLAG, f"{output!r} is a pipe or device, and a {suffix} file needs seeking; "
                                    "write it to a file, or use .wav, .ogg or a headerless encoding")
    return chosen


def _output_error(output: str, error: OSError | sf.SoundFileError) -> CliError:
    reason = error.strerror if isinstance(error, OSError) and error.strerror else error
    return CliError(_OUTPUT_FLAG, f"cannot write {output!r}: {reason}")


def _mode_for_new(target: Path) -> int:
    """The permissions the file would have had if written in place: an existing file's own, else the umask's."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _open_output(output: str, kind: _Kind) -> tuple[BinaryIO, tuple[Path, Path] | None]:
    """The file to write to and, for a regular file, the (temporary, target) pair that commit renames."""
    if kind is _Kind.STDOUT:
        if sys.stdout is None:  # started with it closed
            raise CliError(_OUTPUT_FLAG, f"cannot write {output!r}: stdout is closed")
        return sys.stdout.buffer, None
    if kind is _Kind.STREAM:
        return open(output, "wb"), None
    # Resolved, so that a symlink stays one and the file it names gets the audio.
    target = Path(os.path.realpath(output))
    descriptor, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    os.fchmod(descriptor, _mode_for_new(target))
    # Readable too, for patch_wav_sizes and libsndfile.
    return os.fdopen(descriptor, "w+b"), (Path(name), target)


class AudioOutput:
    """Where the audio goes, written as it arrives.

    A file is written under a temporary name beside it and renamed over it by commit() alone, so a call
    that fails leaves an existing file byte for byte as it was. stdout, pipes and devices get the bytes
    at once: what they have passed on cannot be taken back, and they cannot be rewound.
    """

    def __init__(self, output: str, kind: _Kind, output_format: OutputFormat, sample_rate: int) -> None:
        self._output = output
        self._format = output_format
        self._sound_file: sf.SoundFile | None = None
        self._is_done = False
        try:
            self._file, self._replace = _open_output(output, kind)
        except OSError as error:
            raise _output_error(output, error) from None
        if output_format.soundfile_format is not None:
            try:
                self._sound_file = sf.SoundFile(self._file, "w", samplerate=sample_rate, channels=1,
                                                format=output_format.soundfile_format)
            except (OSError, sf.SoundFileError) as error:
                self.discard()
                raise _output_error(output, error) from None

    def __enter__(self) -> AudioOutput:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self._is_done:
            self.discard()

    def write(self, audio: bytes) -> None:
        if not audio:
            return
        try:
            if self._sound_file is not None:
                self._sound_file.write(np.frombuffer(audio, dtype="<i2"))
            else:
                self._file.write(audio)
                self._file.flush()
        except (OSError, sf.SoundFileError) as error:
            raise _output_error(self._output, error) from None

    def commit(self) -> None:
        """Finish the output; a file then replaces the target."""
        try:
            if self._sound_file is not None:
                self._sound_file.close()
            if self._replace is None:
                self._file.flush()
            elif self._format == _SERVER_FORMATS["wav"]:
                patch_wav_sizes(self._file)
            self._close_file()
            if self._replace is not None:
                os.replace(*self._replace)
        except (OSError, sf.SoundFileError) as error:
            raise _output_error(self._output, error) from None
        self._is_done = True

    def discard(self) -> None:
        """Drop what was written to a file, leaving the target as it was."""
        self._is_done = True
        # Closing finishes the stream into the temporary file, which goes anyway: a failure there is moot.
        with contextlib.suppress(OSError, sf.SoundFileError):
            if self._sound_file is not None:
                self._sound_file.close()
        with contextlib.suppress(OSError):
            self._close_file()
        if self._replace is not None:
            self._replace[0].unlink(missing_ok=True)

    def _close_file(self) -> None:
        if self._file is not sys.stdout.buffer:
            self._file.close()


def patch_wav_sizes(file: BinaryIO) -> None:
    """Set a WAV file's RIFF and data sizes to the file's real ones (a streamed header says 'unknown')."""
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


class WordLog:
    """Where word timings go as they arrive: a line each on stderr, or a JSON object a line in --timestamps-out.

    Each batch is flushed at once, so that someone following the file (or the pipe) sees a word as soon as the
    server has timed it; a file is written in place, not renamed at the end, for the same reason.
    """

    def __init__(self, file: TextIO | None, as_json: bool, name: str = "") -> None:
        self._file = file
        self._as_json = as_json
        self._name = name

    def write(self, words: Iterable[Any]) -> None:
        if self._file is None:
            return
        lines = [_json_line(word) if self._as_json else _text_line(word) for word in words]
        if not lines:
            return
        try:
            self._file.write("".join(lines))
            self._file.flush()
        except OSError as error:
            raise CliError(_TIMESTAMPS_OUT_FLAG, f"cannot write {self._name!r}: {error.strerror or error}") from None


def _text_line(word: Any) -> str:
    return (f"word {word.start_seconds:.3f}-{word.end_seconds:.3f} s: {word.word} "
            f"[{word.start_char}:{word.end_char}]\n")


def _json_line(word: Any) -> str:
    return json.dumps({"word": word.word, "start_char": word.start_char, "end_char": word.end_char,
                       "start_seconds": word.start_seconds, "end_seconds": word.end_seconds},
                      ensure_ascii=False) + "\n"


def _wants_timestamps(args: argparse.Namespace) -> bool:
    return bool(args.timestamps or args.timestamps_out is not None)


@contextlib.contextmanager
def _word_log(args: argparse.Namespace, audio_kind: _Kind) -> Iterator[WordLog]:
    """The WordLog the flags ask for; a file named by --timestamps-out is opened before the call, so that one it
    cannot write is refused before the server is asked for anything."""
    path = args.timestamps_out
    if path is None:
        yield WordLog(sys.stderr if args.timestamps else None, as_json=False)
        return
    if path == "-":
        if audio_kind is _Kind.STDOUT:
            raise CliError(_TIMESTAMPS_OUT_FLAG, f"- is stdout, where the audio already goes ({_OUTPUT_FLAG}); "
                                                 "name a file")
        yield WordLog(sys.stdout, as_json=True, name="stdout")
        return
    try:
        file = open(path, "w", encoding="utf-8")  # noqa: SIM115 -- closed below, after the call
    except OSError as error:
        raise CliError(_TIMESTAMPS_OUT_FLAG, f"cannot write {path!r}: {error.strerror or error}") from None
    with file:
        yield WordLog(file, as_json=True, name=path)


def stdin_fragments() -> Iterator[str]:
    """Text from stdin as soon as it arrives (not line by line), never splitting a UTF-8 character."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while chunk := os.read(sys.stdin.fileno(), _STDIN_READ_BYTES):
        text = decoder.decode(chunk)
        if text:
            yield text
    if tail := decoder.decode(b"", final=True):
        yield tail


# About how fast speech reads text: for a progress bar's total, not for any limit.
_LATIN_CHARS_PER_S = 14.0
_CJK_CHARS_PER_S = 4.5


def _speech_seconds(text: str) -> float:
    cjk = sum(1 for character in text if "\u3040" <= character <= "\u9fff" or "\uac00" <= character <= "\ud7af")
    other = sum(1 for character in text if not character.isspace()) - cjk
    return max(1.0, other / _LATIN_CHARS_PER_S + cjk / _CJK_CHARS_PER_S)


class _RealTimeBar(tqdm):  # type: ignore[misc]
    """Seconds of audio received against the text's expected length, the real-time factor, the time left."""

    def update(self, audio_seconds: float) -> bool | None:
        shown = super().update(audio_seconds)
        elapsed = self.format_dict["elapsed"]
        if self.n > 0:
            self.set_postfix_str(f"rtf {elapsed / self.n:.2f}", refresh=False)
        return shown


def _progress(args: argparse.Namespace) -> contextlib.AbstractContextManager[Any]:
    """With --file, a progress bar on stderr (only on a terminal); otherwise nothing."""
    if getattr(args, "file", None) is None:
        return contextlib.nullcontext(_NoProgress())
    return _RealTimeBar(total=round(_speech_seconds(args.text), 1), unit="s", desc="audio", file=sys.stderr,
                        disable=None, bar_format="{desc}: {n:.1f}/~{total:.0f} s |{bar}| {elapsed}<{remaining}"
                                                 "{postfix}")


class _NoProgress:
    def update(self, audio_seconds: float) -> None:
        return None


def _report(output: str, completion: Any) -> None:
    usage = completion.usage
    reason = type(completion).DESCRIPTOR.fields_by_name["finish_reason"].enum_type.values_by_number[
        completion.finish_reason].name.removeprefix("FINISH_REASON_").lower()
    where = "stdout" if output == "-" else output
    sys.stderr.write(f"wrote {where}: {usage.audio_seconds:.2f} s of audio, {usage.audio_frames} frames, "
                     f"{usage.input_tokens} text tokens, finish reason {reason}, request {completion.request_id}\n")


def _say_or_stream(client: TtsClient, args: argparse.Namespace) -> None:
    kind = _output_kind(args.output)
    chosen = _output_format(args.output, args.encoding, kind)
    voice, audio_format, generation = _request_parts(args, chosen.encoding)
    timestamps = _wants_timestamps(args)
    completion = None
    with AudioOutput(args.output, kind, chosen, args.sample_rate) as sink, _word_log(args, kind) as words:
        if args.command == "say" and args.unary:
            response = client.synthesize(args.text, voice, audio_format, generation, timeout=args.timeout,
                                         word_timestamps=timestamps)
            sink.write(response.audio)
            words.write(response.words)
            completion = response.completion
        else:
            if args.command == "say":
                responses = client.synthesize_online(args.text, voice, audio_format, generation, args.timeout,
                                                     word_timestamps=timestamps)
            else:
                responses = client.streaming_synthesize(stdin_fragments(), voice, audio_format, generation,
                                                        args.timeout, word_timestamps=timestamps)
            with _progress(args) as progress:
                for response in responses:
                    sink.write(response.chunk.audio)
                    progress.update(response.chunk.duration_seconds)
                    words.write(response.words.words)
                    if response.HasField("completion"):
                        completion = response.completion
        sink.commit()
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
    lines.append(f"limits: {limits.max_document_chars} characters a text or a streamed utterance (spoken in "
                 f"segments of up to {limits.max_segment_chars}); "
                 f"{limits.max_audio_seconds:g} s of audio a generation, "
                 f"{limits.max_document_audio_seconds:g} s a text")
    lines += [f"registered voice: {describe_voice(voice)}" for voice in response.registered_voices]
    sys.stdout.write("\n".join(lines) + "\n")


def _rpc_error_message(error: grpc.RpcError, args: argparse.Namespace) -> str:
    code: grpc.StatusCode = error.code()  # type: ignore[attr-defined]
    message = f"{code.name}: {error.details()}"  # type: ignore[attr-defined]
    # The server's own messages start with the request field at fault; these statuses come from reaching
    # the server or from the client's deadline, so the flag that set that up is named instead.
    flag = {grpc.StatusCode.UNAVAILABLE: f"--server {args.server}", grpc.StatusCode.UNAUTHENTICATED: "--api-key",
            grpc.StatusCode.DEADLINE_EXCEEDED: f"--timeout {args.timeout:g}" if args.timeout else None}.get(code)
    return f"{flag}: {message}" if flag else message


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if getattr(args, "file", None) is not None:
        args.text = args.file
    if (args.cert is None) != (args.key is None):
        parser.error("argument --cert/--key: a client certificate needs both --cert and --key")
    try:
        with TtsClient(_connection(args)) as client:
            if args.command == "voices":
                _print_voices(client.list_voices(timeout=args.timeout))
            elif args.command == "voice":
                run_voice_command(client, args)
            else:
                _say_or_stream(client, args)
    except grpc.RpcError as error:
        sys.stderr.write(f"qwen3-tts: {_rpc_error_message(error, args)}\n")
        return 1
    except CliError as error:
        sys.stderr.write(f"qwen3-tts: {error}\n")
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
