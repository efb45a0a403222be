"""The Dockerfile agrees with the package and the chart: the entrypoint is the server's console script,
every package is copied in, and the user, ports and model volume are the ones the chart expects.
(No image is built here: CI has no Docker daemon.)"""

from __future__ import annotations

import json
import shlex
import tomllib
from pathlib import Path

import yaml

from tts_service.config import ServerConfig

ROOT = Path(__file__).resolve().parents[2]


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) for each instruction, with continuation lines joined."""
    joined = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    result = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, arguments = line.partition(" ")
            result.append((keyword.upper(), arguments.strip()))
    return result


def arguments_of(keyword: str) -> list[str]:
    return [arguments for found, arguments in instructions() if found == keyword]


def environment() -> dict[str, str]:
    pairs = [pair for arguments in arguments_of("ENV") for pair in shlex.split(arguments)]
    return dict(pair.split("=", 1) for pair in pairs)


def chart_values() -> dict:
    return yaml.safe_load((ROOT / "helm" / "qwen3-tts" / "values.yaml").read_text())


def test_the_entrypoint_is_the_servers_console_script() -> None:
    (entrypoint,) = arguments_of("ENTRYPOINT")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    (command,) = json.loads(entrypoint)
    assert scripts[command] == "tts_service.__main__:main"


def test_every_package_and_the_proto_are_copied_into_the_image() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [name.rstrip("*") for name in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    copied = {arguments.split()[0] for arguments in arguments_of("COPY")}
    for package in packages:
        if package == "qwen3_tts":  # lives under proto/
            assert "proto" in copied
        else:
            assert package in copied, package


def test_the_user_ports_and_model_volume_match_the_chart() -> None:
    values = chart_values()
    (user,) = arguments_of("USER")
    assert int(user) == values["podSecurityContext"]["runAsUser"] != 0
    exposed = {int(port) for arguments in arguments_of("EXPOSE") for port in arguments.split()}
    assert exposed == {values["server"]["port"], values["metrics"]["port"]}
    assert ServerConfig().port == values["server"]["port"]
    env = environment()
    assert int(env["QWEN3_TTS_PORT"]) == values["server"]["port"]
    assert int(env["QWEN3_TTS_METRICS_PORT"]) == values["metrics"]["port"]
    (volume,) = arguments_of("VOLUME")
    assert json.loads(volume) == ["/models"]
    assert env["HF_HOME"].startswith("/models/")
