"""ElevenLabs' multi-context stream-input protocol, the subset that Pipecat's `ElevenLabsTTSService` and LiveKit's
`livekit-plugins-elevenlabs` speak (docs/elevenlabs-compat-notes.md has the plugins' wire, docs/websocket.md what
is served), translated to and from a call's utterances (`utterances.UtteranceCall`). The WebSocket itself, the
call's frame and its limits are the door's (`websocket_door`); this module only translates.

- The URL (`{voice_id}` and the query) becomes the call's voice, output format and options, checked before the
  upgrade, so that a client learns of a bad voice or format from the HTTP status: Pipecat ignores error messages.
- A context is an utterance, `context_id` its id. Its first message opens it; text is appended; `flush` releases
  the last word (the engine holds a word back until the text shows it complete); `close_context` right after an
  empty-text flush is the end of the turn (spoken to its end, then `isFinal`), any other `close_context` is a
  barge-in (cancelled at once, then `isFinal`): both plugins end a turn with that flush and interrupt without it.
- Audio goes back as `{"audio", "alignment", "normalizedAlignment", "contextId"}` and each utterance's end as
  `{"isFinal": true, "contextId"}`.
"""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from qwen3_tts.v1.protocol import tts_pb2
from tts_service.api.errors import ApiError, invalid
from tts_service.api.utterances import UtteranceCall, UtteranceItem, check_utterance_id
from tts_service.api.word_alignment import AlignmentCursor, WordTiming, align
from tts_service.audio.output import SUPPORTED_SAMPLE_RATES, AudioEncoding, OutputFormat, mp3_bit_rates
from tts_service.engine import ModelInfo

logger = logging.getLogger("tts_service.api.server")

pb: Any = tts_pb2
ROUTE = "/v1/text-to-speech/{voice_id}/multi-stream-input"
# Models whose names make LiveKit's plugin speak another protocol (text-to-dialogue) on another path.
DIALOGUE_MODEL_PREFIXES = ("eleven_v3", "eleven_v4")
# ElevenLabs' language codes for the model's languages.
LANGUAGES = {"en": "english", "zh": "chinese", "de": "german", "it": "italian", "pt": "portuguese",
             "es": "spanish", "ja": "japanese", "ko": "korean", "fr": "french", "ru": "russian"}
_PCM = re.compile(r"pcm_(\d+)")
_OPUS = re.compile(r"opus_48000_\d+")
_MP3 = re.compile(r"mp3_(\d+)_(\d+)")
# What ElevenLabs streams when the URL names no format.
_DEFAULT_OUTPUT_FORMAT = "mp3_44100_128"
_G711 = {"ulaw_8000": AudioEncoding.MULAW, "alaw_8000": AudioEncoding.ALAW}
_MOST_CHARS_QUOTED = 32
# The fields the shared steps name, as this protocol names them.
_FIELDS = {"utterance_id": "context_id"}
_FLAGS = ("flush", "close_context", "close_socket")


@dataclass(frozen=True)
class StreamOptions:
    """What the URL asks for."""

    voice: Any  # a qwen3_tts.v1.VoiceSelection
    output: OutputFormat
    auto_mode: bool  # each text message is a whole unit (a sentence): its last word is spoken without waiting
    cumulative_alignment: bool  # alignment times from the context's start (sync_alignment=true), else per message
    inactivity_timeout_s: float | None


def stream_options(voice_id: str, query: Mapping[str, str], model: ModelInfo) -> StreamOptions:
    """The URL's voice and query, checked; an ApiError names the offending part (`voice_id` or the parameter).
    Parameters this server does not use are ignored, as ElevenLabs' clients send several."""
    model_id = query.get("model_id", "")
    if model_id.startswith(DIALOGUE_MODEL_PREFIXES):
        raise invalid("model_id", f"{_quoted(model_id)} makes clients speak ElevenLabs' text-to-dialogue protocol, "
                                  "which is not served; name another model (any other id is accepted)")
    return StreamOptions(voice=_voice(voice_id, _language(query.get("language_code"), model), model),
                         output=output_format(query.get("output_format")),
                         auto_mode=_boolean(query, "auto_mode", default=False),
                         cumulative_alignment=_boolean(query, "sync_alignment", default=False),
                         inactivity_timeout_s=_inactivity_timeout(query.get("inactivity_timeout")))


def output_format(name: str | None) -> OutputFormat:
    """`mp3_<rate>_<kbps>` (MP3 frames at that constant bit rate; ElevenLabs' default, mp3_44100_128, when the URL
    names none), `pcm_<rate>` (16-bit little-endian mono), `ulaw_8000`, `alaw_8000`, `opus_48000_<kbps>` (Ogg/Opus;
    the bit rate is the encoder's own) as one of our output formats."""
    rates = ", ".join(map(str, SUPPORTED_SAMPLE_RATES))
    supported = (f"mp3_<rate>_<kbps> or pcm_<rate> (rate one of {rates}), ulaw_8000, alaw_8000 or "
                 "opus_48000_<kbps>")
    name = _DEFAULT_OUTPUT_FORMAT if name is None else name
    if (mp3 := _MP3.fullmatch(name)) is not None and int(mp3[1]) in SUPPORTED_SAMPLE_RATES:
        rate, kbps = int(mp3[1]), int(mp3[2])
        if kbps not in mp3_bit_rates(rate):
            raise invalid("output_format", f"{_quoted(name)}: MP3 at {rate} Hz has no {kbps} kbps; use one of "
                                           f"{', '.join(map(str, mp3_bit_rates(rate)))}")
        return OutputFormat(AudioEncoding.MP3, rate, kbps)
    if (pcm := _PCM.fullmatch(name)) is not None and int(pcm[1]) in SUPPORTED_SAMPLE_RATES:
        return OutputFormat(AudioEncoding.PCM16, int(pcm[1]))
    if name in _G711:
        return OutputFormat(_G711[name], 8000)
    if _OPUS.fullmatch(name):
        return OutputFormat(AudioEncoding.OGG_OPUS, 48000)
    raise invalid("output_format", f"{_quoted(name)} is not supported; use {supported}")


def _voice(voice_id: str, language: str, model: ModelInfo) -> Any:
    """A built-in speaker of a CustomVoice model, or a registered voice of a Base model (looked up when the
    call is prepared)."""
    if model.model_type == "custom_voice":
        if voice_id.lower() not in model.speakers:
            raise invalid("voice_id", f"{_quoted(voice_id)} is not a speaker of the loaded model; use one of "
                                      f"{', '.join(model.speakers)}")
        return pb.VoiceSelection(speaker=voice_id.lower(), language=language)
    if model.model_type == "base":
        return pb.VoiceSelection(voice_id=voice_id, language=language)
    raise invalid("voice_id", f"the loaded {model.model_type} model has no named voices to speak with here")


def _language(code: str | None, model: ModelInfo) -> str:
    if code is None:
        return "auto"
    language = LANGUAGES.get(code.lower())
    if language is None or language not in model.languages:
        usable = [code for code, language in LANGUAGES.items() if language in model.languages]
        raise invalid("language_code", f"{_quoted(code)} is not a language of the loaded model; use one of "
                                       f"{', '.join(usable)}")
    return language


def _boolean(query: Mapping[str, str], name: str, default: bool) -> bool:
    value = query.get(name)
    if value is None:
        return default
    if value.lower() not in ("true", "false"):
        raise invalid(name, "must be true or false")
    return value.lower() == "true"


def _inactivity_timeout(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        raise invalid("inactivity_timeout", "must be a number of seconds") from None
    if not 0 < seconds < float("inf"):
        raise invalid("inactivity_timeout", "must be a positive number of seconds")
    return seconds


def _quoted(value: str) -> str:
    return repr(value) if len(value) <= _MOST_CHARS_QUOTED else f"a value of {len(value)} characters"


def error_message(error: ApiError, context_id: str | None) -> dict[str, Any]:
    """An error as this protocol's message: LiveKit fails the named context's stream with `message`."""
    message = error.message
    if error.field in _FIELDS:
        message = message.replace(f"{error.field}:", f"{_FIELDS[error.field]}:", 1)
    body: dict[str, Any] = {"error": error.code.name.lower(), "message": message}
    if context_id is not None:
        body["contextId"] = context_id
    return body


# -- client messages ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientMessage:
    text: str | None
    context_id: str | None
    flush: bool = False
    close_context: bool = False
    close_socket: bool = False


def client_message(body: Any) -> ClientMessage:
    """A message's fields, each checked for its type; fields this server does not use (voice_settings,
    generation_config, pronunciation_dictionary_locators, ...) are ignored, as ElevenLabs' clients send them."""
    if not isinstance(body, dict):
        raise invalid("message", "must be a JSON object")
    text, context_id = body.get("text"), body.get("context_id")
    if text is not None and not isinstance(text, str):
        raise invalid("text", "must be a string")
    if context_id is not None:
        if not isinstance(context_id, str):
            raise invalid("context_id", "must be a string")
        check_utterance_id(context_id, "context_id")
    flags = {name: body.get(name, False) for name in _FLAGS}
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise invalid(name, "must be true or false")
    return ClientMessage(text, context_id, **flags)


@dataclass
class _Context:
    context_id: str
    text: str = ""  # everything appended to the utterance, as the engine got it: word timings index into it
    is_closing: bool = False  # close_context came after the turn's end: speaking to its end
    is_ended: bool = False  # closed or cancelled: what still comes for it is ignored
    is_final: bool = False  # completed: isFinal sent
    is_input_done: bool = False  # the last content message was an empty-text flush: the turn's end
    cursor: AlignmentCursor = field(default_factory=AlignmentCursor)


class ElevenLabsCall:
    """One socket's contexts on a call's utterances: `apply` each client message, `messages` for each item."""

    def __init__(self, utterances: UtteranceCall, options: StreamOptions) -> None:
        self._utterances = utterances
        self._options = options
        self._contexts: dict[str, _Context] = {}

    @property
    def has_open_contexts(self) -> bool:
        return any(not context.is_final for context in self._contexts.values())

    @property
    def is_owed_audio(self) -> bool:
        """Whether a turn the client has ended (or interrupted) has not yet had its isFinal."""
        return any(context.is_ended and not context.is_final for context in self._contexts.values())

    async def apply(self, message: ClientMessage) -> bool:
        """Carry out one client message; False once the client has asked to close the socket."""
        if message.close_socket:
            self.end(cancel_unfinished=True)
            return False
        if message.context_id is None:
            if message.text or message.flush or message.close_context:
                raise invalid("context_id", "is required on every message but a keep-alive ({\"text\": \"\"}) "
                                            "and close_socket; the implicit default context is not supported")
            return True  # a keep-alive: reading it reset the idle limit
        context = await self._context(message)
        if context is None or context.is_ended:
            if message.close_context and context is not None and context.is_closing and not context.is_final:
                self._utterances.cancel(context.context_id)  # interrupted after its turn had ended
            return True
        if message.text:
            await self._append(context, message.text)
        if message.flush:
            await self._flush(context, is_input_done=not message.text)
        if message.close_context:
            self._close(context)
        return True

    def end(self, cancel_unfinished: bool) -> None:
        """No more messages: contexts whose turn has ended are spoken to their end, the others are cancelled
        (`cancel_unfinished`) or spoken to their end too."""
        for context in self._contexts.values():
            if not context.is_ended and (cancel_unfinished and not context.is_input_done):
                context.is_ended = True
                self._utterances.cancel(context.context_id)
        self._utterances.end_text()

    async def _context(self, message: ClientMessage) -> _Context | None:
        """The message's context; a new one is opened by any message but a lone close_context or flush."""
        assert message.context_id is not None
        context = self._contexts.get(message.context_id)
        if context is not None or message.text is None:
            return context
        context = _Context(message.context_id)
        if not self._contexts:
            await self._utterances.open_first(context.context_id)
        self._contexts[context.context_id] = context
        return context

    async def _append(self, context: _Context, text: str) -> None:
        """Text as the engine should read it: whitespace alone only separates (an init's " " is not text);
        with auto_mode each message is whole, so it is joined to the last with a space and ends with one, which
        lets its last word be spoken without waiting for the next message."""
        if not text.strip():
            if context.text and not context.text[-1].isspace():
                await self._feed(context, " ")
            return
        if self._options.auto_mode:
            if context.text and not context.text[-1].isspace() and not text[0].isspace():
                text = " " + text
            if not text[-1].isspace():
                text += " "
        await self._feed(context, text)
        context.is_input_done = False

    async def _flush(self, context: _Context, is_input_done: bool) -> None:
        """Speak what has been sent: the last word is released by a space, as the text holds none after it."""
        if context.text and not context.text[-1].isspace():
            await self._feed(context, " ")
        context.is_input_done = is_input_done

    def _close(self, context: _Context) -> None:
        context.is_ended = True
        if context.is_input_done:
            context.is_closing = True
            self._utterances.close(context.context_id)
        else:
            self._utterances.cancel(context.context_id)

    async def _feed(self, context: _Context, text: str) -> None:
        await self._utterances.append(context.context_id, text)
        context.text += text

    # -- server messages --------------------------------------------------------------------------

    def messages(self, item: UtteranceItem) -> list[dict[str, Any]]:
        """The messages for one of the call's items: its audio (with the alignment of the words it carries), and
        at the utterance's end, isFinal. A context the client has already dropped gets its isFinal alone."""
        context = self._contexts[item.utterance_id]
        if context.is_final:
            return []
        is_last = item.summary is not None
        out = []
        if not item.is_cancelled:
            audio = item.audio.chunk.audio if item.audio is not None and item.audio.chunk is not None else b""
            words: Sequence[WordTiming] = item.audio.words if item.audio is not None else ()
            alignment, context.cursor = align(words, context.text, context.cursor,
                                              self._options.cumulative_alignment, is_last=is_last)
            if audio or alignment is not None:
                aligned = alignment.as_json() if alignment is not None else None
                out.append({"audio": base64.b64encode(audio).decode() if audio else None, "alignment": aligned,
                            "normalizedAlignment": aligned, "contextId": context.context_id})
        if is_last:
            context.is_final = context.is_ended = True
            out.append({"isFinal": True, "contextId": context.context_id})
        return out
