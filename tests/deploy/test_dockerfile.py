"""The Dockerfile agrees with the package and the chart: the entrypoint is the server's console script,
every package is copied in (and none is left out of the build context), the user, ports and model volume
are the ones the chart expects, and the server's listeners can bind the image's default host.
(No image is built here: CI has no Docker daemon.)"""

from __future__ import annotations

import fnmatch
import json
import shlex
import tomllib
from pathlib import Path

import yaml

from tests.deploy.listeners import check_bindable
from tts_service.api.config import ServerConfig, load_config

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


def build_args() -> dict[str, str]:
    """Each ARG's default ("" where it has none)."""
    return {name: default for name, _, default in (arguments.partition("=") for arguments in arguments_of("ARG"))}


def ignored_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def chart_values() -> dict:
    return yaml.safe_load((ROOT / "helm" / "qwen3-tts" / "values.yaml").read_text())


def test_the_entrypoint_is_the_servers_console_script() -> None:
    (entrypoint,) = arguments_of("ENTRYPOINT")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    (command,) = json.loads(entrypoint)
    assert scripts[command] == "tts_service.api.main:main"


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


def test_the_image_runs_on_a_cuda_base_and_can_build_tritons_launcher() -> None:
    (base,) = arguments_of("FROM")
    image = build_args()["CUDA_IMAGE"] if base == "${CUDA_IMAGE}" else base
    assert image.startswith("nvidia/cuda:")
    # Triton (the fused kernels) compiles a C launcher on first use: a compiler and Python.h at run time.
    (apt,) = [arguments for arguments in arguments_of("RUN") if "apt-get install" in arguments]
    packages = set(apt.split())
    assert {"gcc", "python3-dev", "libsndfile1"} <= packages


def test_both_listeners_can_bind_the_host_the_image_gives_the_server() -> None:
    env = {name: value for name, value in environment().items() if name.startswith("QWEN3_TTS_")}
    config = load_config([], environ=env)
    assert config.metrics_port is not None
    check_bindable(config)


def test_the_build_context_keeps_what_the_image_copies_and_drops_the_rest() -> None:
    patterns = ignored_patterns()
    sources = [name for arguments in arguments_of("COPY") for name in arguments.split()[:-1]]
    assert "README.md" in sources  # the package's readme, which pip needs to build it
    for source in sources:
        assert not any(fnmatch.fnmatch(source, pattern) for pattern in patterns), source
    for unwanted in (".git", ".venv-ci", ".whl", "tests", "benchmarks", "helm"):
        assert any(fnmatch.fnmatch(unwanted, pattern) for pattern in patterns), unwanted
