"""The server's configuration: command-line flags over environment variables over defaults.

This is the only module that reads the environment. A setting is declared once, as a field of `ServerConfig` (the
front door's own) or of its `EngineConfig` (`tts_service.engine.settings.setting`); every field with help text is a
flag, generated here with its default and its variable: `--some-name` has `QWEN3_TTS_SOME_NAME`. API keys may also
come from `QWEN3_TTS_API_KEYS` (comma-separated), which suits a secret mounted as an environment variable. Tracing
follows the standard OpenTelemetry variables: it is on when an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), unless OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none; the SDK reads the
rest of them itself. The result is one frozen, validated ServerConfig, printed once at start with the keys redacted.
"""

from __future__ import annotations

import argparse
import os
import re
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from observability.logs import LOG_FORMATS
from tts_service.engine.config import EngineConfig
from tts_service.engine.settings import (
    Check,
    SettingError,
    above,
    at_least,
    check_fields,
    declaration,
    one_of,
    require,
    setting,
)
from tts_service.model.sources import DEFAULT_MODEL

ENV_PREFIX = "QWEN3_TTS_"
API_KEYS_ENV = "QWEN3_TTS_API_KEYS"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_PORT = Check("0-65535", lambda port: 0 <= port <= 65535)
_OPTIONAL_PORT = Check("1-65535", lambda port: 0 < port <= 65535)


def is_several_devices(device: str) -> bool:
    """Whether `--device` names more than one device (or `all`, which may)."""
    return device == "all" or "," in device


def _is_device_choice(device: str) -> bool:
    if not is_several_devices(device) or device == "all":
        return re.fullmatch(r"auto|all|cpu|cuda(:\d+)?", device) is not None
    names = [name.strip() for name in device.split(",")]
    return len(set(names)) == len(names) and all(re.fullmatch(r"cuda:\d+", name) for name in names)


_DEVICE = Check("cuda, cuda:N, cpu, auto, all, or distinct cuda:N separated by commas", _is_device_choice)
_FILE = Check("a file", lambda path: path.is_file())
_BARE_KEYS = Check("keys that are non-empty and carry no surrounding whitespace",
                   lambda keys: all(key and key.strip() == key for key in keys))


class ConfigError(ValueError):
    """A setting is invalid; the message names the flag (or the environment variable it came from)."""


def _read_api_keys_file(text: str) -> frozenset[str]:
    """Keys from a file: one per line; blank lines and lines starting with # are skipped."""
    path = Path(text)
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror}") from None
    return frozenset(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))


@dataclass(frozen=True)
class InputLimits:
    """The one table of how long each request field may be. The API refuses a longer value before doing any
    work with it, naming the field and the limit."""

    text_chars: int
    instruction_chars: int
    reference_text_chars: int
    reference_audio_bytes: int
    # Built-in speaker names and language names are short words: anything longer is no name.
    speaker_chars: int = 64
    language_chars: int = 32


@dataclass(frozen=True)
class ServerConfig:
    """The front door's own settings beside the engine's (`engine`), each declared once with its flag's help."""

    model: str = setting(DEFAULT_MODEL, "checkpoint directory, Hugging Face repo id, or random:<size>-<type>")
    device: str = setting("auto", "cuda, cuda:N, cpu, auto (CUDA when available), or several GPUs behind this "
                                  "server, an engine core each: cuda:0,cuda:1,... or all (every visible GPU)",
                          check=_DEVICE)
    host: str = setting("[::]", "address to listen on; [::] is every interface")
    port: int = setting(50051, "port to listen on; 0 picks a free one", check=_PORT)
    metrics_port: int | None = setting(None, "port for Prometheus metrics over HTTP (/metrics); unset: none",
                                       check=_OPTIONAL_PORT)
    # For probes that cannot speak TLS (the kubelet's).
    health_port: int | None = setting(None, "port serving only grpc.health.v1 in plaintext, for probes that cannot "
                                            "use TLS; unset: none (health is always served on --port too)",
                                      check=_OPTIONAL_PORT)
    http_port: int | None = setting(None, "port for the OpenAI-compatible HTTP API (POST /v1/audio/speech, GET "
                                          "/v1/models), with the same API keys, limits and TLS as --port; unset: "
                                          "none", check=_OPTIONAL_PORT)
    # The HTTP ports (the OpenAI-compatible API's and /metrics') bound each connection from its accept, before any API
    # key is checked; the API bounds each request's body. Reference audio never travels over HTTP.
    # 200,000 characters of CJK text, each escaped as \uXXXX in JSON, take 1.2 MB.
    max_http_body_bytes: int = setting(2 * 1024 * 1024, "largest request body the HTTP API reads; a longer one gets "
                                                        "413 (2 MiB holds a --max-document-chars text however it is "
                                                        "escaped)", check=at_least(1))
    http_header_timeout_seconds: float = setting(10.0, "on the HTTP ports, longest a request head may take from its "
                                                       "first byte, and a TLS handshake from the connection's "
                                                       "opening; then the connection is closed", check=above(0))
    http_body_timeout_seconds: float = setting(30.0, "longest the HTTP API waits for a request body once its head "
                                                     "has arrived; then 408 and the connection is closed",
                                               check=above(0))
    http_keepalive_timeout_seconds: float = setting(15.0, "on the HTTP ports, longest a connection may wait for its "
                                                          "next request, from its opening or its last response; then "
                                                          "it is closed", check=above(0))
    max_http_connections: int = setting(1024, "connections open on each HTTP port; one beyond is closed as it is "
                                              "accepted", check=at_least(1))
    # A load generator or a proxy on one address counts as one client.
    max_http_connections_per_address: int = setting(256, "connections open on each HTTP port from one client "
                                                         "address (an IPv6 client's /64); one beyond is closed as it "
                                                         "is accepted", check=at_least(1))
    # gRPC carries all of a client's calls on one connection. grpc core caps the connections of a port in all (it
    # counts none by address) and closes one whose handshake (TLS, then HTTP/2's preface) is not done in time.
    max_grpc_connections: int = setting(1024, "connections open on the gRPC port (and on --health-port); one beyond "
                                              "is closed as it is accepted", check=at_least(1))
    grpc_handshake_timeout_seconds: float = setting(10.0, "on the gRPC ports, longest a connection may take from its "
                                                          "opening to finish its handshake (TLS, then HTTP/2's "
                                                          "preface); then it is closed", check=above(0))
    max_message_bytes: int = setting(32 * 1024 * 1024, "largest request message accepted", check=at_least(1))
    # 60 s of 48 kHz stereo float WAV fit.
    max_reference_audio_bytes: int = setting(24 * 1024 * 1024, "largest voice-cloning reference recording, encoded",
                                             check=at_least(1))
    max_stream_seconds: float = setting(600.0, "longest call of any shape (a stalled reader's or a trickling "
                                               "stream's too)", check=above(0))
    # By default one caller may take every place the engine has.
    max_calls_per_caller: int = setting(EngineConfig().max_running, "speech calls one caller (API key; without "
                                                                    "keys, peer address) may have in progress",
                                        check=at_least(1))
    max_utterances_per_call: int = setting(8, "utterances one StreamingSynthesize call or WebSocket connection "
                                              "may have open (neither completed nor cancelled) at once; each "
                                              "beyond the first also takes a place of its caller's "
                                              "(--max-calls-per-caller)", check=at_least(1))
    max_lexicons: int = setting(1000, "registered pronunciation lexicons the server keeps, all callers together "
                                      "(with --voice-store, in its lexicons/ folder)", check=at_least(1))
    max_lexicons_per_caller: int = setting(100, "registered pronunciation lexicons one caller (API key) may keep",
                                           check=at_least(1))
    max_waiting_clones: int = setting(8, "voice-clone encodings in progress or waiting, beyond which calls with "
                                         "reference audio get RESOURCE_EXHAUSTED", check=at_least(1))
    # A clone of a 10 s reference is some 50 KB here.
    max_inline_clones: int = setting(256, "voices cloned from reference audio sent inline that are kept, by caller "
                                          "and recording, most recently used first, so that the same recording sent "
                                          "again is not decoded and encoded again; 0: encode it on every call",
                                     check=at_least(0))
    stream_idle_timeout_seconds: float = setting(60.0, "longest wait for the next text of a StreamingSynthesize "
                                                       "call", check=above(0))
    # Playback is counted from the first chunk. The first audio stays a frame away, and the front door writes a few
    # messages per second of audio instead of 12.5.
    coalesce_when_ahead_seconds: float = setting(1.0, "once a listener holds this much unplayed audio, send its "
                                                      "audio in messages of at least --coalesced-message-seconds",
                                                 check=above(0))
    coalesced_message_seconds: float = setting(0.32, "the least audio per message for a listener that is well ahead "
                                                     "(0.32 s is 4 frames)", check=above(0))
    tls_cert: Path | None = setting(None, "PEM certificate chain of the server (enables TLS)", check=_FILE)
    tls_key: Path | None = setting(None, "PEM private key of the server", check=_FILE)
    tls_client_ca: Path | None = setting(None, "PEM CA bundle; clients must present a certificate it signed (mTLS)",
                                         check=_FILE)
    api_keys: frozenset[str] = setting(frozenset(), "file of accepted API keys, one per line, # comments (or env "
                                                    f"{API_KEYS_ENV}, comma-separated); unset: no authentication",
                                       flag="api-keys-file", check=_BARE_KEYS, parse=_read_api_keys_file, secret=True)
    drain_timeout_seconds: float = setting(30.0, "on SIGTERM/SIGINT, how long running calls may take to finish",
                                           check=at_least(0))
    # Its load and graph capture come before, and a voice clone's encoding runs beside its loop, so neither counts;
    # the first step of a shape never seen may compile kernels.
    engine_stall_timeout_seconds: float = setting(30.0, "how long the engine core's process may make no progress "
                                                        "(no message from it, or one step that never ends) while it "
                                                        "holds work before the server kills it, ends its calls with "
                                                        "UNAVAILABLE and exits with status 1 (with "
                                                        "--no-engine-process, how long one step may take)",
                                                  check=above(0))
    # In the server's process and the engine core's. The runner's thread gives the GIL up around every graph launch
    # and device wait and must win it back from its process's event loop.
    gil_switch_interval_ms: float = setting(5.0, "longest a thread holds the GIL while another waits for it "
                                                 "(Python's sys.setswitchinterval); shorter lets the engine's thread "
                                                 "win it back from the event loop sooner under load",
                                            check=Check("in (0, 1000]", lambda ms: 0 < ms <= 1000))
    # As vLLM and SGLang run theirs: the gRPC front door, protobuf and audio encoding then never hold the GIL while
    # the core queues a step.
    engine_process: bool = setting(True, "run the engine core (scheduler, model runner, GPU) in its own process "
                                         "beside the server's, so that gRPC's work never delays a step; "
                                         "--no-engine-process keeps one process")
    log_level: str = setting("INFO", "DEBUG, INFO, WARNING or ERROR", check=one_of(*LOG_LEVELS), parse=str.upper)
    log_format: str = setting("json", "json (one object per line, with request and trace ids, for log collectors) or "
                                      "text (for a terminal)", check=one_of(*LOG_FORMATS), parse=str.lower)
    is_tracing_enabled: bool = False  # from the OTEL_* variables: spans exported over OTLP/gRPC
    engine: EngineConfig = field(default_factory=EngineConfig)

    def __post_init__(self) -> None:
        try:
            self._check()
        except SettingError as error:
            raise _refusal(ServerConfig, error) from None

    def _check(self) -> None:
        # The pair first: a key without its certificate is refused as that, whether or not its file exists.
        require(self, (self.tls_cert is None) == (self.tls_key is None), "tls_cert", "given with --tls-key")
        require(self, self.tls_client_ca is None or self.tls_cert is not None, "tls_client_ca",
                "given with --tls-cert and --tls-key: mTLS needs the server's own certificate")
        check_fields(self)
        require(self, self.engine_process or not is_several_devices(self.device), "device",
                "one device with --no-engine-process: several GPUs need an engine core each")
        require(self, self.health_port is None or self.health_port not in (self.port, self.metrics_port),
                "health_port", "other than --port and --metrics-port")
        require(self, self.http_port is None or self.http_port not in (self.port, self.metrics_port, self.health_port),
                "http_port", "other than --port, --metrics-port and --health-port")

    @property
    def input_limits(self) -> InputLimits:
        return InputLimits(text_chars=self.engine.max_document_chars, instruction_chars=self.engine.max_text_chars,
                           reference_text_chars=self.engine.max_reference_text_chars,
                           reference_audio_bytes=min(self.max_reference_audio_bytes, self.max_message_bytes))

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def bare_host(self) -> str:
        """The host as socket APIs take it: an IPv6 address without gRPC's brackets ("[::]" -> "::")."""
        return self.host.removeprefix("[").removesuffix("]")

    @property
    def uses_tls(self) -> bool:
        return self.tls_cert is not None

    def describe(self) -> str:
        """One line per setting, the engine's too, for the start-up log; API keys appear only as a count."""
        own = [(item.name, getattr(self, item.name)) for item in fields(self) if item.name != "engine"]
        engine = [(f"engine.{item.name}", getattr(self.engine, item.name)) for item in fields(self.engine)]
        keys = f"{len(self.api_keys)} key(s), redacted" if self.api_keys else "none (no authentication)"
        return "\n".join(f"  {name}: {keys if name == 'api_keys' else value}" for name, value in own + engine)


def _refusal(owner: type, error: SettingError) -> ConfigError:
    """A field's refusal in the words of the flag that sets it."""
    (item,) = [item for item in fields(owner) if item.name == error.name]
    return ConfigError(f"--{_flag_name(item)}: must be {error.requirement}")


def _flag_name(item: Field[Any]) -> str:
    return declaration(item).flag or item.name.replace("_", "-")


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"must be a whole number, got {text[:20]!r}") from None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"must be a number, got {text[:20]!r}") from None


def _is_true(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
        raise ValueError(f"must be true or false, got {text[:20]!r}")
    return value in ("true", "1", "yes", "on")


# How a flag's text reads, by the type of its field, where the field declares no reader of its own.
_READERS: dict[type, Callable[[str], Any]] = {int: _whole_number, float: _number, str: str, Path: Path, bool: _is_true}


@dataclass(frozen=True)
class Flag:
    """One of the server's flags, generated from the field that it sets: ServerConfig's own or its engine's."""

    field: Field[Any]
    is_engine: bool
    kind: type  # the field's type, None aside

    @property
    def name(self) -> str:
        return _flag_name(self.field)

    @property
    def key(self) -> str:
        """The flag's name as a Python name: argparse's destination."""
        return self.name.replace("-", "_")

    @property
    def env_name(self) -> str:
        return ENV_PREFIX + self.key.upper()

    @property
    def is_switch(self) -> bool:
        """--name and --no-name."""
        return self.kind is bool

    @property
    def help(self) -> str:
        text = f"{declaration(self.field).help} (default {_shown_default(self.field.default)}) [env {self.env_name}]"
        return text.replace("%", "%%")  # argparse formats help text with %

    def read(self, text: str, source: str) -> Any:
        """The flag's text, or its variable's, as the field's value; a refusal names `source`."""
        reader = declaration(self.field).parse or _READERS[self.kind]
        try:
            return reader(text)
        except ValueError as error:
            raise ConfigError(f"{source}: {error}") from None


def _shown_default(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None or value == frozenset():
        return "unset"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _flags_of(owner: type, is_engine: bool) -> list[Flag]:
    kinds = get_type_hints(owner)
    return [Flag(item, is_engine, _without_none(kinds[item.name])) for item in fields(owner)
            if declaration(item).help]


def _without_none(hint: Any) -> type:
    """`int | None` -> int; `frozenset[str]` -> frozenset."""
    if get_origin(hint) is types.UnionType:
        (hint,) = [arg for arg in get_args(hint) if arg is not type(None)]
    return get_origin(hint) or hint


# The front door's flags, then the engine's.
FLAGS: tuple[Flag, ...] = (*_flags_of(ServerConfig, is_engine=False), *_flags_of(EngineConfig, is_engine=True))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qwen3-tts-server",
        description="Serve a Qwen3-TTS 12 Hz model over gRPC. Every flag can also be set as the environment "
                    f"variable {ENV_PREFIX}<FLAG> (e.g. {ENV_PREFIX}PORT); flags win.")
    groups = {False: parser.add_argument_group("the server"), True: parser.add_argument_group("the engine")}
    for flag in FLAGS:
        # SUPPRESS leaves a flag not given out of the result, so that its variable, or else its field's default,
        # applies.
        action = argparse.BooleanOptionalAction if flag.is_switch else "store"
        groups[flag.is_engine].add_argument(f"--{flag.name}", dest=flag.key, action=action,
                                            default=argparse.SUPPRESS, help=flag.help)
    return parser


def _set_values(argv: Sequence[str] | None, environ: Mapping[str, str]) -> Iterator[tuple[Flag, Any]]:
    """Each flag given on the command line, or else in its variable, with its value."""
    given = vars(_parser().parse_args(argv))
    for flag in FLAGS:
        if flag.key in given:
            text_or_switch = given[flag.key]
            yield flag, text_or_switch if flag.is_switch else flag.read(text_or_switch, f"--{flag.name}")
        elif flag.env_name in environ:
            yield flag, flag.read(environ[flag.env_name], flag.env_name)


def load_config(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> ServerConfig:
    """Flags (`argv`, default sys.argv) over the environment (default os.environ) over the defaults."""
    environ = os.environ if environ is None else environ
    server: dict[str, Any] = {}
    engine: dict[str, Any] = {}
    for flag, value in _set_values(argv, environ):
        (engine if flag.is_engine else server)[flag.field.name] = value
    server["api_keys"] = server.get("api_keys", frozenset()) | {
        key.strip() for key in environ.get(API_KEYS_ENV, "").split(",") if key.strip()}
    return ServerConfig(**server, engine=_engine_config(engine), is_tracing_enabled=is_tracing_enabled(environ))


def _engine_config(settings: dict[str, Any]) -> EngineConfig:
    try:
        return EngineConfig(**settings)
    except SettingError as error:
        raise _refusal(EngineConfig, error) from None


def is_tracing_enabled(environ: Mapping[str, str]) -> bool:
    """Whether the OTEL_* variables ask for traces that this server can send (OTLP over gRPC)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporter == "none":
        return False
    if exporter != "otlp":
        raise ConfigError(f"OTEL_TRACES_EXPORTER: this server exports traces with otlp (or none), not {exporter!r}")
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not endpoint:
        return False
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = environ.get(name)
        if protocol:
            if protocol.strip().lower() != "grpc":
                raise ConfigError(f"{name}: this server sends OTLP over grpc, not {protocol!r}")
            break
    return True
