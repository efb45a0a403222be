"""The server's configuration: flags over environment over defaults, validated, keys never printed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tts_service.api.config import ConfigError, ServerConfig, load_config
from tts_service.api.main import main, resolve_devices
from tts_service.engine.config import EngineConfig
from tts_service.model.sources import DEFAULT_MODEL


def test_flags_override_the_environment_which_overrides_the_defaults() -> None:
    environ = {"QWEN3_TTS_PORT": "6000", "QWEN3_TTS_MAX_WAITING": "7", "QWEN3_TTS_DRAIN_TIMEOUT_SECONDS": "2.5"}
    config = load_config(["--port", "7000", "--model", "random:tiny-base"], environ)
    assert (config.port, config.engine.max_waiting, config.drain_timeout_seconds) == (7000, 7, 2.5)
    assert config.model == "random:tiny-base" and config.engine.max_running == EngineConfig().max_running
    assert load_config([], {}).model == DEFAULT_MODEL


def test_api_keys_come_from_a_file_and_the_environment_and_are_never_described(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("# one key per line\nfile-key-1\n\n  file-key-2  \n")
    config = load_config(["--api-keys-file", str(keys_file)], {"QWEN3_TTS_API_KEYS": "env-key-1, env-key-2"})
    assert config.api_keys == {"file-key-1", "file-key-2", "env-key-1", "env-key-2"}
    for text in (config.describe(), repr(config)):
        assert "key-1" not in text and "key-2" not in text
    assert "4 key(s), redacted" in config.describe()


@pytest.mark.parametrize(("argv", "flag"), [
    (["--port", "70000"], "--port"),
    (["--max-concurrent", "0"], "--max-concurrent"),
    (["--max-audio-seconds", "-1"], "--max-audio-seconds"),
    (["--tls-cert", "/nonexistent/cert.pem", "--tls-key", "/nonexistent/key.pem"], "--tls-cert"),
    (["--tls-key", "/nonexistent/key.pem"], "--tls-cert"),
    (["--log-level", "chatty"], "--log-level"),
    (["--log-format", "xml"], "--log-format"),
    (["--api-keys-file", "/nonexistent/keys"], "--api-keys-file"),
    (["--gil-switch-interval-ms", "0"], "--gil-switch-interval-ms"),
    (["--device", "gpu"], "--device"),
    (["--device", "cuda:0,cuda:0"], "--device"),
    (["--device", "cuda:0,cpu"], "--device"),
    (["--device", "cuda:0,cuda:1", "--no-engine-process"], "--device"),
    (["--device", "all", "--no-engine-process"], "--device"),
])
def test_invalid_settings_are_refused_naming_the_flag(argv: list[str], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        load_config(argv, {})


def test_several_gpus_are_named_in_one_list_or_as_all_and_resolved_to_an_engine_core_each(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    assert load_config(["--device", "cuda:0,cuda:1"], {}).device == "cuda:0,cuda:1"
    assert resolve_devices("cuda:1, cuda:0") == ["cuda:1", "cuda:0"]
    assert resolve_devices("cpu") == ["cpu"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert resolve_devices("all") == ["cuda:0", "cuda:1", "cuda:2"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="--device all"):
        resolve_devices("all")


def test_the_server_command_exits_with_a_usage_error_for_a_bad_setting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--port", "-1"]) == 2
    assert "--port" in capsys.readouterr().err


ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}


@pytest.mark.parametrize(("environ", "is_enabled"), [
    ({}, False),
    (ENDPOINT, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317"}, True),
    ({**ENDPOINT, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, True),
    ({**ENDPOINT, "OTEL_TRACES_EXPORTER": "none"}, False),
    ({**ENDPOINT, "OTEL_SDK_DISABLED": "true"}, False),
    ({"OTEL_SERVICE_NAME": "tts"}, False),
])
def test_tracing_is_on_exactly_when_the_otel_variables_set_an_otlp_endpoint(environ: dict[str, str],
                                                                            is_enabled: bool) -> None:
    assert load_config([], environ).is_tracing_enabled is is_enabled


@pytest.mark.parametrize(("environ", "variable"), [
    ({**ENDPOINT, "OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
    ({**ENDPOINT, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
    ({**ENDPOINT, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
     "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"),
])
def test_tracing_settings_this_server_cannot_honour_are_refused_naming_the_variable(environ: dict[str, str],
                                                                                   variable: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        load_config([], environ)


def test_the_step_profiler_is_off_unless_a_flag_or_the_environment_turns_it_on() -> None:
    assert not load_config([], {}).engine.profile_steps
    assert load_config(["--profile-steps"], {}).engine.profile_steps
    assert load_config([], {"QWEN3_TTS_PROFILE_STEPS": "true"}).engine.profile_steps
    assert not load_config(["--no-profile-steps"], {"QWEN3_TTS_PROFILE_STEPS": "1"}).engine.profile_steps
    with pytest.raises(ConfigError, match="QWEN3_TTS_PROFILE_STEPS"):
        load_config([], {"QWEN3_TTS_PROFILE_STEPS": "maybe"})


def test_the_predictor_kernel_is_on_unless_a_flag_or_the_environment_turns_it_off() -> None:
    assert load_config([], {}).engine.use_predictor_kernel
    assert not load_config(["--no-predictor-kernel"], {}).engine.use_predictor_kernel
    assert not load_config([], {"QWEN3_TTS_PREDICTOR_KERNEL": "false"}).engine.use_predictor_kernel
    assert load_config(["--predictor-kernel"], {"QWEN3_TTS_PREDICTOR_KERNEL": "0"}).engine.use_predictor_kernel


@pytest.mark.parametrize("name", ["QWEN3_TTS_ENGINE_PROCESS", "QWEN3_TTS_PROFILE_STEPS", "QWEN3_TTS_PREDICTOR_KERNEL"])
def test_a_switch_in_the_environment_that_is_not_true_or_false_is_refused_naming_its_own_variable(name: str) -> None:
    with pytest.raises(ConfigError, match=f"^{name}: must be true or false"):
        load_config([], {name: "maybe"})


def test_the_codec_decoder_stays_fp32_unless_bf16_is_asked_for() -> None:
    assert load_config([], {}).engine.codec_dtype == "float32"
    assert load_config(["--codec-dtype", "bfloat16"], {}).engine.codec_dtype == "bfloat16"
    assert load_config([], {"QWEN3_TTS_CODEC_DTYPE": "BFloat16"}).engine.codec_dtype == "bfloat16"
    with pytest.raises(ConfigError, match="--codec-dtype: must be one of float32, bfloat16, got 'float16'"):
        load_config(["--codec-dtype", "float16"], {})


def test_the_codec_convolution_dtype_is_auto_unless_set_and_fp16_only_in_an_fp32_codec() -> None:
    assert load_config([], {}).engine.codec_convolution_dtype == "auto"
    flag = ["--codec-convolution-dtype", "float16"]
    assert load_config(flag, {}).engine.codec_convolution_dtype == "float16"
    assert load_config([], {"QWEN3_TTS_CODEC_CONVOLUTION_DTYPE": "Float16"}).engine.codec_convolution_dtype == "float16"
    assert load_config(["--codec-dtype", "bfloat16"], {}).engine.codec_convolution_dtype == "auto"
    with pytest.raises(ConfigError, match="--codec-convolution-dtype: must be auto or float32 with codec_dtype "
                                          "'bfloat16'"):
        load_config([*flag, "--codec-dtype", "bfloat16"], {})
    with pytest.raises(ConfigError, match="--codec-convolution-dtype: must be one of auto, float32, float16, "
                                          "got 'half'"):
        load_config(["--codec-convolution-dtype", "half"], {})


def test_the_server_command_sets_the_gil_switch_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    from tts_service.api import main as server_main

    async def serve_nothing(config: ServerConfig) -> int:
        return 0

    monkeypatch.setattr(server_main, "serve", serve_nothing)
    monkeypatch.setattr(server_main, "configure_logging", lambda level, log_format: None)
    before = sys.getswitchinterval()
    try:
        assert main(["--gil-switch-interval-ms", "0.5"]) == 0
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    finally:
        sys.setswitchinterval(before)


def test_steps_are_scheduled_ahead_from_64_decodes_unless_set_or_off() -> None:
    assert load_config([], {}).engine.min_decodes_to_schedule_ahead == 64
    assert load_config(["--min-decodes-to-schedule-ahead", "8"], {}).engine.min_decodes_to_schedule_ahead == 8
    environ = {"QWEN3_TTS_MIN_DECODES_TO_SCHEDULE_AHEAD": "off"}
    assert load_config([], environ).engine.min_decodes_to_schedule_ahead is None
    with pytest.raises(ConfigError, match="--min-decodes-to-schedule-ahead: must be >= 0 or off"):
        load_config(["--min-decodes-to-schedule-ahead", "-1"], {})
