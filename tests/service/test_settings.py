"""Each setting is declared once, as a field, and the server's flags are generated from the fields: every flag shows
in --help with its default and its variable, its variable and its flag set it, and a value its check refuses is
refused naming the flag."""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from tts_service.api.config import FLAGS, ConfigError, Flag, ServerConfig, load_config
from tts_service.engine.settings import declaration

# Every public flag (Helm, the docs and the clients use these names), with a valid text other than its default and
# the value the loaded configuration must then hold. Paths are relative to the test's own directory.
NON_DEFAULT: dict[str, tuple[str, Any]] = {
    "model": ("random:tiny-base", "random:tiny-base"),
    "device": ("cpu", "cpu"),
    "aligner-model": ("random:tiny", "random:tiny"),
    "host": ("127.0.0.1", "127.0.0.1"),
    "port": ("6000", 6000),
    "metrics-port": ("9090", 9090),
    "health-port": ("9091", 9091),
    "http-port": ("8000", 8000),
    "max-http-body-bytes": ("2048", 2048),
    "http-header-timeout-seconds": ("2.5", 2.5),
    "http-body-timeout-seconds": ("3.5", 3.5),
    "http-keepalive-timeout-seconds": ("4.5", 4.5),
    "max-http-connections": ("64", 64),
    "max-http-connections-per-address": ("8", 8),
    "max-grpc-connections": ("32", 32),
    "grpc-handshake-timeout-seconds": ("1.5", 1.5),
    "max-message-bytes": ("4096", 4096),
    "max-reference-audio-bytes": ("1024", 1024),
    "max-stream-seconds": ("90", 90.0),
    "max-calls-per-caller": ("3", 3),
    "max-utterances-per-call": ("2", 2),
    "max-lexicons": ("5", 5),
    "max-lexicons-per-caller": ("3", 3),
    "max-waiting-clones": ("2", 2),
    "stream-idle-timeout-seconds": ("5", 5.0),
    "coalesce-when-ahead-seconds": ("2", 2.0),
    "coalesced-message-seconds": ("0.64", 0.64),
    "tls-cert": ("server.pem", Path("server.pem")),
    "tls-key": ("server.pem", Path("server.pem")),
    "tls-client-ca": ("server.pem", Path("server.pem")),
    "api-keys-file": ("keys", frozenset({"key-1"})),
    "drain-timeout-seconds": ("0", 0.0),
    "engine-stall-timeout-seconds": ("12", 12.0),
    "gil-switch-interval-ms": ("0.5", 0.5),
    "engine-process": ("false", False),
    "log-level": ("debug", "DEBUG"),
    "log-format": ("TEXT", "text"),
    "model-download-timeout-seconds": ("0", 0.0),
    "max-concurrent": ("4", 4),
    "max-waiting": ("16", 16),
    "max-text-chars": ("400", 400),
    "max-document-chars": ("5000", 5000),
    "max-segment-chars": ("300", 300),
    "max-document-audio-seconds": ("600", 600.0),
    "max-reference-text-chars": ("100", 100),
    "max-audio-seconds": ("0.48", 0.48),
    "max-reference-audio-seconds": ("5", 5.0),
    "kv-blocks": ("64", 64),
    "min-decodes-to-schedule-ahead": ("off", None),
    "max-unread-audio-seconds": ("0.4", 0.4),
    "codec-dtype": ("bfloat16", "bfloat16"),
    "codec-convolution-dtype": ("float32", "float32"),
    "predictor-kernel": ("0", False),
    "profile-steps": ("yes", True),
    "voice-store": ("voices", Path("voices")),
    "max-voices": ("2", 2),
    "max-voices-per-caller": ("1", 1),
    "max-voice-bytes": ("1500", 1500),
    "max-primed-voices": ("0", 0),
    "max-inline-clones": ("0", 0),
}
# A text each checked setting refuses, where -1 (below every count, size, port and time) is none.
REFUSED: dict[str, str] = {
    "codec-dtype": "float16", "codec-convolution-dtype": "half", "log-level": "chatty", "log-format": "xml",
    "tls-cert": "missing.pem", "tls-key": "missing.pem", "tls-client-ca": "missing.pem", "voice-store": "server.pem",
}
# The keys file's reader strips every key, so that only a configuration built in code can fail the keys' check.
CHECKED = [flag for flag in FLAGS if declaration(flag.field).check is not None and flag.name != "api-keys-file"]


def env_name(flag_name: str) -> str:
    """The documented rule, written out here so that the test does not take it from the code it tests."""
    return "QWEN3_TTS_" + flag_name.upper().replace("-", "_")


def companions(flag_name: str) -> dict[str, str]:
    """What a setting cannot go without: TLS's certificate and key come together, and mTLS needs them."""
    if not flag_name.startswith("tls-"):
        return {}
    return {"QWEN3_TTS_TLS_CERT": "server.pem", "QWEN3_TTS_TLS_KEY": "server.pem"}


def value_of(config: ServerConfig, flag: Flag) -> Any:
    return getattr(config.engine if flag.is_engine else config, flag.field.name)


@pytest.fixture
def in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "server.pem").write_text("PEM")
    (tmp_path / "keys").write_text("# one key\nkey-1\n")
    (tmp_path / "voices").mkdir()
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def help_text() -> str:
    output = io.StringIO()
    with contextlib.redirect_stdout(output), pytest.raises(SystemExit):
        load_config(["--help"], {})
    return " ".join(output.getvalue().split())  # argparse wraps its lines where it likes


def test_the_generated_flags_are_exactly_the_public_ones() -> None:
    assert sorted(flag.name for flag in FLAGS) == sorted(NON_DEFAULT)
    assert [flag.env_name for flag in FLAGS] == [env_name(flag.name) for flag in FLAGS]


def test_every_field_of_the_server_is_a_flag_but_the_engine_and_the_tracing_switch() -> None:
    """The OTEL_* variables switch tracing on; the engine's own fields are flags where they declare help."""
    assert {item.name for item in fields(ServerConfig) if not declaration(item).help} == {"engine",
                                                                                          "is_tracing_enabled"}


@pytest.mark.parametrize("flag", FLAGS, ids=lambda flag: flag.name)
def test_every_flag_shows_in_help_with_the_default_the_server_uses_and_its_variable(flag: Flag,
                                                                                   help_text: str) -> None:
    assert re.search(rf"(^| )--{flag.name}[ ,]", help_text.split(" options: ", 1)[1])
    shown = re.search(rf"\(default ([^()]*)\) \[env {env_name(flag.name)}\]", help_text)
    assert shown is not None
    if shown[1] == "unset":
        assert flag.field.default is None or flag.field.default == frozenset()
    else:
        assert flag.read(shown[1], "--help") == flag.field.default


@pytest.mark.usefixtures("in_tmp_path")
@pytest.mark.parametrize("flag", FLAGS, ids=lambda flag: flag.name)
def test_every_setting_round_trips_through_its_variable_and_its_flag(flag: Flag) -> None:
    text, expected = NON_DEFAULT[flag.name]
    assert expected != flag.field.default
    assert value_of(load_config([], {**companions(flag.name), env_name(flag.name): text}), flag) == expected
    argv = [f"--{flag.name}" if expected else f"--no-{flag.name}"] if flag.is_switch else [f"--{flag.name}", text]
    assert value_of(load_config(argv, companions(flag.name)), flag) == expected


@pytest.mark.usefixtures("in_tmp_path")
@pytest.mark.parametrize("flag", CHECKED, ids=lambda flag: flag.name)
def test_a_value_that_fails_its_fields_check_is_refused_naming_the_flag(flag: Flag) -> None:
    environ = {**companions(flag.name), env_name(flag.name): REFUSED.get(flag.name, "-1")}
    with pytest.raises(ConfigError, match=rf"^--{flag.name}: "):
        load_config([], environ)


def test_api_keys_that_fail_their_check_are_refused_naming_the_flag_without_showing_them() -> None:
    with pytest.raises(ConfigError, match=r"^--api-keys-file: must be keys that") as refused:
        ServerConfig(api_keys=frozenset({"padded-key "}))
    assert "padded-key" not in str(refused.value)


@pytest.mark.parametrize(("argv", "environ", "source"), [
    (["--port", "http"], {}, "--port"),
    ([], {"QWEN3_TTS_PORT": "http"}, "QWEN3_TTS_PORT"),
    ([], {"QWEN3_TTS_MAX_AUDIO_SECONDS": "long"}, "QWEN3_TTS_MAX_AUDIO_SECONDS"),
])
def test_a_text_that_is_no_value_of_its_type_is_refused_naming_where_it_came_from(
        argv: list[str], environ: dict[str, str], source: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{source}: must be a (whole )?number, got "):
        load_config(argv, environ)
