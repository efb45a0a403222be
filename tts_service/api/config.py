"""The server's configuration: command-line flags over environment variables over defaults.

This is the only module that reads the environment. Every flag `--some-name` has the variable
`QWEN3_TTS_SOME_NAME`; API keys may also come from `QWEN3_TTS_API_KEYS` (comma-separated), which
suits a secret mounted as an environment variable. Tracing follows the standard OpenTelemetry
variables: it is on when an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), unless OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none;
the SDK reads the rest of them itself. The result is one frozen, validated ServerConfig, printed
once at start with the keys redacted.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

from observability.logs import LOG_FORMATS
from tts_service.engine.config import CODEC_CONVOLUTION_DTYPES, CODEC_DTYPES, EngineConfig
from tts_service.model.sources import DEFAULT_MODEL

ENV_PREFIX = "QWEN3_TTS_"
API_KEYS_ENV = "QWEN3_TTS_API_KEYS"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_ENGINE = EngineConfig()


class ConfigError(ValueError):
    """A setting is invalid; the message names the flag."""


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
    model: str = DEFAULT_MODEL
    # A Hub download failing for a passing reason is retried this long; then the server exits 1.
    model_download_timeout_seconds: float = _ENGINE.model_download_timeout_s
    device: str = "auto"  # "auto": CUDA when available, else the CPU
    host: str = "[::]"
    port: int = 50051  # 0: any free port
    metrics_port: int | None = None  # Prometheus metrics over HTTP on this port; None: no metrics endpoint
    # grpc.health.v1 alone, in plaintext, on this port: for probes that cannot speak TLS (the kubelet's).
    health_port: int | None = None
    # The OpenAI-compatible HTTP API (/v1/audio/speech, /v1/models) on this port; None: none.
    http_port: int | None = None
    # The HTTP ports (the OpenAI-compatible API's and /metrics') bound each connection from its accept, before any API
    # key is checked; the API bounds each request's body.
    max_http_body_bytes: int = 1024 * 1024  # a speech request's JSON: reference audio never travels over HTTP
    http_header_timeout_seconds: float = 10.0  # a request head (and a TLS handshake), from its first byte to its end
    http_body_timeout_seconds: float = 30.0  # a request body, from the end of its head
    http_keepalive_timeout_seconds: float = 15.0  # the wait for a whole next request head, from opening or a response
    max_http_connections: int = 1024  # open on one HTTP port
    # Open on one HTTP port from one client address: a load generator or a proxy on one address counts as one.
    max_http_connections_per_address: int = 256
    # The engine's settings keep the engine's defaults (EngineConfig), under the names of their flags.
    max_text_chars: int = _ENGINE.max_text_chars  # of text, and of an instruction
    max_reference_text_chars: int = _ENGINE.max_reference_text_chars  # an in-context clone's transcript
    max_concurrent: int = _ENGINE.max_running  # requests generating at once (the engine's slots and batch)
    max_waiting: int = _ENGINE.max_waiting  # queued requests before RESOURCE_EXHAUSTED
    max_message_bytes: int = 32 * 1024 * 1024
    max_reference_audio_seconds: float = _ENGINE.max_reference_audio_s
    max_reference_audio_bytes: int = 24 * 1024 * 1024  # encoded; 60 s of 48 kHz stereo float WAV fit
    max_audio_seconds: float = _ENGINE.max_audio_s  # per request; also the default when a request sets none
    max_stream_seconds: float = 600.0  # a call's whole life, whatever its shape
    # Speech calls one caller (API key, or peer address without keys) may have in progress.
    max_calls_per_caller: int = _ENGINE.max_running
    max_waiting_clones: int = 8  # calls whose reference audio is being decoded and encoded, or waits to be
    voice_store: Path | None = None  # registered voices' directory; None: in memory, lost when the process ends
    max_voices: int = _ENGINE.max_voices  # registered voices stored, all callers together
    max_voices_per_caller: int = _ENGINE.max_voices_per_owner  # registered voices of one caller (API key)
    max_voice_bytes: int = _ENGINE.max_voice_bytes  # one registered voice, as stored
    profile_steps: bool = _ENGINE.profile_steps  # the step profiler: phase times into the metrics
    # A code predictor call at one or two streams as one persistent kernel; off for a GPU share capped below its
    # SM count (MPS's active-thread percentage).
    predictor_kernel: bool = _ENGINE.use_predictor_kernel
    codec_dtype: str = _ENGINE.codec_dtype  # "float32" or "bfloat16" (faster; the reference's own bf16 error)
    # "auto" (float16 on CUDA), "float32" or "float16": a float32 codec's residual units' convolutions
    codec_convolution_dtype: str = _ENGINE.codec_convolution_dtype
    stream_idle_timeout_seconds: float = 60.0  # StreamingSynthesize: longest wait for the next text
    # A streamed call's audio its reader has not taken; then it pauses.
    max_unread_audio_seconds: float = _ENGINE.max_unread_audio_s
    # Once a listener holds this much audio it has not played yet (playback counted from the first chunk), the
    # call's audio goes out in messages of at least coalesced_message_seconds: the first audio stays a frame
    # away, and the front door writes a few messages per second of audio instead of 12.5.
    coalesce_when_ahead_seconds: float = 1.0
    coalesced_message_seconds: float = 0.32
    kv_blocks: int | None = _ENGINE.num_kv_blocks  # the KV cache's size in blocks; None: from free GPU memory
    # From this many decodes a step, the next step is scheduled while it runs; None: every step in order.
    min_decodes_to_schedule_ahead: int | None = _ENGINE.min_decodes_to_schedule_ahead
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None  # set: clients must present a certificate it signed (mTLS)
    api_keys: frozenset[str] = field(default=frozenset(), repr=False)
    drain_timeout_seconds: float = 30.0
    # With the engine core in its own process: how long it may make no progress (no message from it, or one step
    # that never ends) while it holds requests or calls, before the server kills it, fails its calls with
    # UNAVAILABLE and exits with status 1. Its load and graph capture come before, and a voice clone's encoding
    # runs beside its loop, so neither counts; the first step of a shape never seen may compile kernels.
    engine_stall_timeout_seconds: float = 30.0
    # How long a thread may hold the GIL while another waits for it (Python's default is 5 ms), in the server's
    # process and the engine core's. The runner's thread gives the GIL up around every graph launch and device
    # wait and must win it back from its process's event loop.
    gil_switch_interval_ms: float = 5.0
    # The engine core (scheduler, runner, GPU) in a process of its own, as vLLM and SGLang run theirs: the gRPC
    # front door, protobuf and audio encoding then never hold the GIL while it queues a step. Off: one process.
    engine_process: bool = True
    log_level: str = "INFO"
    log_format: str = "json"  # json: one object per line, for log collectors; text: for a terminal
    is_tracing_enabled: bool = False  # from the OTEL_* variables: spans exported over OTLP/gRPC

    def __post_init__(self) -> None:
        _require(0 <= self.port <= 65535, "port", f"must be 0-65535, got {self.port}")
        for name in ("metrics_port", "health_port", "http_port"):
            port = getattr(self, name)
            _require(port is None or 0 < port <= 65535, name, f"must be 1-65535, got {port}")
        _require(self.health_port is None or self.health_port not in (self.port, self.metrics_port), "health_port",
                 "must differ from --port and --metrics-port")
        _require(self.http_port is None or self.http_port not in (self.port, self.metrics_port, self.health_port),
                 "http_port", "must differ from --port, --metrics-port and --health-port")
        for name in ("max_http_body_bytes", "max_http_connections", "max_http_connections_per_address"):
            _require(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        for name in ("http_header_timeout_seconds", "http_body_timeout_seconds", "http_keepalive_timeout_seconds"):
            _require(getattr(self, name) > 0, name, f"must be > 0, got {getattr(self, name)}")
        for name in ("max_text_chars", "max_reference_text_chars", "max_concurrent", "max_waiting",
                     "max_message_bytes", "max_reference_audio_bytes", "max_calls_per_caller", "max_waiting_clones",
                     "max_voices", "max_voices_per_caller", "max_voice_bytes"):
            _require(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        if self.kv_blocks is not None:
            _require(self.kv_blocks >= 1, "kv_blocks", f"must be >= 1, got {self.kv_blocks}")
        if self.min_decodes_to_schedule_ahead is not None:
            _require(self.min_decodes_to_schedule_ahead >= 0, "min_decodes_to_schedule_ahead",
                     f"must be >= 0 or off, got {self.min_decodes_to_schedule_ahead}")
        for name in ("max_reference_audio_seconds", "max_audio_seconds", "max_stream_seconds",
                     "stream_idle_timeout_seconds", "max_unread_audio_seconds", "coalesce_when_ahead_seconds",
                     "coalesced_message_seconds"):
            _require(getattr(self, name) > 0, name, f"must be > 0, got {getattr(self, name)}")
        _require(0 < self.gil_switch_interval_ms <= 1000, "gil_switch_interval_ms",
                 f"must be in (0, 1000], got {self.gil_switch_interval_ms}")
        _require(self.model_download_timeout_seconds >= 0, "model_download_timeout_seconds",
                 f"must be >= 0, got {self.model_download_timeout_seconds}")
        _require(self.drain_timeout_seconds >= 0, "drain_timeout_seconds",
                 f"must be >= 0, got {self.drain_timeout_seconds}")
        _require(self.engine_stall_timeout_seconds > 0, "engine_stall_timeout_seconds",
                 f"must be > 0, got {self.engine_stall_timeout_seconds}")
        _require(self.codec_dtype in CODEC_DTYPES, "codec_dtype",
                 f"must be one of {', '.join(CODEC_DTYPES)}, got {self.codec_dtype!r}")
        _require(self.codec_convolution_dtype in CODEC_CONVOLUTION_DTYPES, "codec_convolution_dtype",
                 f"must be one of {', '.join(CODEC_CONVOLUTION_DTYPES)}, got {self.codec_convolution_dtype!r}")
        _require(self.codec_convolution_dtype != "float16" or self.codec_dtype == "float32", "codec_convolution_dtype",
                 f"must be auto or float32 with codec_dtype {self.codec_dtype!r}")
        _require(self.log_level in LOG_LEVELS, "log_level", f"must be one of {', '.join(LOG_LEVELS)}")
        _require(self.log_format in LOG_FORMATS, "log_format", f"must be one of {', '.join(LOG_FORMATS)}")
        _require((self.tls_cert is None) == (self.tls_key is None), "tls_cert",
                 "--tls-cert and --tls-key go together")
        _require(self.tls_client_ca is None or self.tls_cert is not None, "tls_client_ca",
                 "mTLS needs the server's own --tls-cert and --tls-key")
        for name in ("tls_cert", "tls_key", "tls_client_ca"):
            path = getattr(self, name)
            _require(path is None or path.is_file(), name, f"{path} is not a file")
        _require(self.voice_store is None or not self.voice_store.exists() or self.voice_store.is_dir(),
                 "voice_store", f"{self.voice_store} is not a directory")
        _require(all(key and key.strip() == key for key in self.api_keys), "api_keys",
                 "keys must be non-empty and carry no surrounding whitespace")

    @property
    def input_limits(self) -> InputLimits:
        return InputLimits(text_chars=self.max_text_chars, instruction_chars=self.max_text_chars,
                           reference_text_chars=self.max_reference_text_chars,
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

    def engine_config(self) -> EngineConfig:
        """The engine under these limits; what no flag sets keeps the engine's default."""
        return EngineConfig(model_download_timeout_s=self.model_download_timeout_seconds,
                            max_running=self.max_concurrent, max_waiting=self.max_waiting,
                            max_text_chars=self.max_text_chars, max_reference_text_chars=self.max_reference_text_chars,
                            max_audio_s=self.max_audio_seconds,
                            max_reference_audio_s=self.max_reference_audio_seconds,
                            max_unread_audio_s=self.max_unread_audio_seconds, num_kv_blocks=self.kv_blocks,
                            min_decodes_to_schedule_ahead=self.min_decodes_to_schedule_ahead,
                            profile_steps=self.profile_steps, use_predictor_kernel=self.predictor_kernel,
                            codec_dtype=self.codec_dtype, codec_convolution_dtype=self.codec_convolution_dtype,
                            voice_store_dir=self.voice_store,
                            max_voices=self.max_voices, max_voices_per_owner=self.max_voices_per_caller,
                            max_voice_bytes=self.max_voice_bytes)

    def describe(self) -> str:
        """One line per setting, for the start-up log; API keys appear only as a count."""
        lines = []
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name == "api_keys":
                value = f"{len(value)} key(s), redacted" if value else "none (no authentication)"
            lines.append(f"  {item.name}: {value}")
        return "\n".join(lines)


def _require(condition: bool, name: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"--{name.replace('_', '-')}: {message}")


def _parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    defaults = ServerConfig()
    parser = argparse.ArgumentParser(
        prog="qwen3-tts-server",
        description="Serve a Qwen3-TTS 12 Hz model over gRPC. Every flag can also be set as the environment "
                    f"variable {ENV_PREFIX}<FLAG> (e.g. {ENV_PREFIX}PORT); flags win.")

    def add(flag: str, kind: type, help_text: str) -> None:
        name = flag.replace("-", "_")
        env_name = ENV_PREFIX + name.upper()
        default = environ.get(env_name, getattr(defaults, name, None))
        # argparse converts string defaults (here: from the environment) with `type` too.
        parser.add_argument(f"--{flag}", type=kind, default=default, help=f"{help_text} [env {env_name}]")

    add("model", str, f"checkpoint directory, Hugging Face repo id, or random:<size>-<type> (default {DEFAULT_MODEL})")
    add("model-download-timeout-seconds", float,
        "how long a Hugging Face Hub download that fails for a reason that may pass (the Hub unreachable, "
        "overloaded or rate limiting) is retried with backoff before the server exits with status 1; the server "
        f"never serves another model in place of --model (default {defaults.model_download_timeout_seconds:g})")
    add("device", str, "cuda, cuda:N, cpu, or auto (CUDA when available)")
    add("host", str, "address to listen on (default [::], every interface)")
    add("port", int, "port to listen on; 0 picks a free one (default 50051)")
    add("metrics-port", int, "port for Prometheus metrics over HTTP (/metrics); unset: none")
    add("health-port", int, "port serving only grpc.health.v1 in plaintext, for probes that cannot use TLS; "
                            "unset: none (health is always served on --port too)")
    add("http-port", int, "port for the OpenAI-compatible HTTP API (POST /v1/audio/speech, GET /v1/models), with "
                          "the same API keys, limits and TLS as --port; unset: none")
    add("max-http-body-bytes", int, "largest request body the HTTP API reads; a longer one gets 413 (default 1048576: "
                                    "1 MiB, far more than a speech request's JSON)")
    add("http-header-timeout-seconds", float, "on the HTTP ports, longest a request head (or a TLS handshake) may take "
                                              "from its first byte; then the connection is closed (default 10)")
    add("http-body-timeout-seconds", float, "longest the HTTP API waits for a request body once its head has arrived; "
                                            "then 408 and the connection is closed (default 30)")
    add("http-keepalive-timeout-seconds", float, "on the HTTP ports, longest a connection may wait for its next "
                                                 "request, from its opening or its last response; then it is closed "
                                                 "(default 15)")
    add("max-http-connections", int, "connections open on each HTTP port; one beyond is closed as it is accepted "
                                     "(default 1024)")
    add("max-http-connections-per-address", int, "connections open on each HTTP port from one client address (an "
                                                 "IPv6 client's /64); one beyond is closed as it is accepted "
                                                 "(default 256)")
    add("max-text-chars", int, "most characters of text per request (and of an instruction)")
    add("max-reference-text-chars", int, "most characters of a voice clone's reference transcript")
    add("max-concurrent", int, "requests generating at once")
    add("codec-dtype", str.lower, "the codec decoder's dtype: float32 (default) or bfloat16, faster under load; "
                                  "its waveform then moves about as far from fp32 as the reference's own bf16 "
                                  "decoder's does")
    add("codec-convolution-dtype", str.lower, "what a float32 codec's residual units' convolutions read and write: "
                                              "auto (default: float16 on CUDA, float32 elsewhere), float32 (cuDNN "
                                              "runs them in TF32), or float16 with fp32 accumulation, faster and as "
                                              "near exact fp32 as the reference's own fp32 decoder")
    add("max-waiting", int, "queued requests beyond which new ones get RESOURCE_EXHAUSTED")
    add("max-message-bytes", int, "largest request message accepted")
    add("max-reference-audio-seconds", float, "longest voice-cloning reference recording")
    add("max-reference-audio-bytes", int, "largest voice-cloning reference recording, encoded")
    add("max-audio-seconds", float, "longest audio one request may generate (and the default)")
    add("max-stream-seconds", float, "longest call of any shape (a stalled reader's or a trickling stream's too)")
    add("max-calls-per-caller", int, "speech calls one caller (API key; without keys, peer address) may have in "
                                     "progress")
    add("max-waiting-clones", int, "voice-clone encodings in progress or waiting, beyond which calls with "
                                   "reference audio get RESOURCE_EXHAUSTED")
    add("voice-store", Path, "directory keeping registered voices (CreateVoice) across restarts; unset: in memory, "
                             "lost when the server stops")
    add("max-voices", int, "registered voices stored, all callers together; CreateVoice beyond gets RESOURCE_EXHAUSTED")
    add("max-voices-per-caller", int, "registered voices one caller (API key; without keys, all callers share "
                                      "one namespace) may keep; CreateVoice beyond gets RESOURCE_EXHAUSTED")
    add("max-voice-bytes", int, "largest registered voice as stored (an in-context voice grows with its reference)")
    add("stream-idle-timeout-seconds", float, "longest wait for the next text of a StreamingSynthesize call")
    add("max-unread-audio-seconds", float, "audio a streaming reader may leave unread before its request pauses")
    add("coalesce-when-ahead-seconds", float, "once a listener holds this much unplayed audio, send its audio in "
                                              "messages of at least --coalesced-message-seconds (default 1.0)")
    add("coalesced-message-seconds", float, "the least audio per message for a listener that is well ahead "
                                            "(default 0.32: 4 frames)")
    add("kv-blocks", int, "KV cache size in blocks (default: from free GPU memory)")
    add("min-decodes-to-schedule-ahead", _count_or_off,
        "from this many decodes a step, schedule the next step while it runs, so that the GPU never waits for "
        "the host between steps (about a tenth more audio per second at 128 streams, one step more before a new "
        "request's prefill); off: every step in order (default 64)")
    add("tls-cert", Path, "PEM certificate chain of the server (enables TLS)")
    add("tls-key", Path, "PEM private key of the server")
    add("tls-client-ca", Path, "PEM CA bundle; clients must present a certificate it signed (mTLS)")
    add("api-keys-file", Path, f"file of accepted API keys, one per line, # comments (or env {API_KEYS_ENV})")
    add("drain-timeout-seconds", float, "on SIGTERM/SIGINT, how long running calls may take to finish")
    add("engine-stall-timeout-seconds", float, "how long the engine core's process may make no progress while it "
                                               "holds work before the server kills it, ends its calls with "
                                               "UNAVAILABLE and exits with status 1 (default 30)")
    add("gil-switch-interval-ms", float, "longest a thread holds the GIL while another waits for it (Python's "
                                         "sys.setswitchinterval); shorter lets the engine's thread win it back from "
                                         "the event loop sooner under load")
    add("log-level", str.upper, f"one of {', '.join(LOG_LEVELS)}")
    add("log-format", str.lower, "json (one object per line, with request and trace ids) or text")
    def add_switch(flag: str, help_text: str) -> None:
        """An on/off flag (--x and --no-x) whose default the environment may set to true or false."""
        name = flag.replace("-", "_")
        env_name = ENV_PREFIX + name.upper()
        parser.add_argument(f"--{flag}", action=argparse.BooleanOptionalAction,
                            default=_is_true(environ.get(env_name, str(getattr(defaults, name))), env_name),
                            help=f"{help_text} [env {env_name}]")

    add_switch("engine-process", "run the engine core (scheduler, model runner, GPU) in its own process beside the "
                                 "server's, so that gRPC's work never delays a step; --no-engine-process keeps one "
                                 "process")
    add_switch("profile-steps", "time every engine step's phases (host and GPU) and the server's per-chunk work into "
                                "the metrics (qwen3_tts_*_phase_seconds); off by default")
    add_switch("predictor-kernel", "at one or two streams, run each code predictor call as one persistent kernel "
                                   "(one program per SM, about a seventh off a frame); --no-predictor-kernel for a "
                                   "GPU share capped below its SM count, such as MPS's active-thread percentage")
    return parser


def _count_or_off(text: str) -> int | None:
    """An int flag that 'off' (or 'none') turns off."""
    return None if text.strip().lower() in ("off", "none") else int(text)


def _is_true(text: str, env_name: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise ConfigError(f"{env_name}: must be true or false, got {text[:20]!r}")
    return value in ("true", "1", "yes")


def read_api_keys(path: Path) -> frozenset[str]:
    """Keys from a file: one per line; blank lines and lines starting with # are skipped."""
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"--api-keys-file: cannot read {path}: {error.strerror}") from None
    return frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))


def load_config(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> ServerConfig:
    """Flags (`argv`, default sys.argv) over the environment (default os.environ) over the defaults."""
    environ = os.environ if environ is None else environ
    args = vars(_parser(environ).parse_args(argv))
    keys_file = args.pop("api_keys_file")
    keys = read_api_keys(Path(keys_file)) if keys_file else frozenset()
    keys |= {key.strip() for key in environ.get(API_KEYS_ENV, "").split(",") if key.strip()}
    return ServerConfig(**args, api_keys=keys, is_tracing_enabled=is_tracing_enabled(environ))


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
