"""The layers import only downward: api -> engine -> runner -> model, the scheduler beside them without torch,
and the served code never reaches into benchmarks, tests or the client package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# For each package, the first-party modules it may import (a prefix admits its submodules too).
ALLOWED: dict[str, tuple[str, ...]] = {
    "tts_service/api": ("tts_service.api", "tts_service.engine", "tts_service.audio", "tts_service.model.sources",
                        "observability", "qwen3_tts"),
    "tts_service/engine": ("tts_service.engine", "tts_service.runner", "tts_service.model", "scheduler",
                           "observability"),
    "tts_service/runner": ("tts_service.runner", "tts_service.model"),
    "tts_service/model": ("tts_service.model",),
    "tts_service/eager": ("tts_service.eager", "tts_service.runner.params", "tts_service.runner.sampling",
                          "tts_service.runner.frame_codes", "tts_service.model", "tts_service.audio"),
    "tts_service/audio": ("tts_service.audio",),
    "scheduler": ("scheduler",),
    "observability": ("observability", "qwen3_tts"),
    "clients": ("clients", "qwen3_tts", "observability.playback"),
}
FIRST_PARTY = ("tts_service", "scheduler", "observability", "clients", "benchmarks", "tests", "qwen3_tts")
# What the API may touch on the engine: its methods, never its parts.
ENGINE_INTERNALS = {"runner", "scheduler"}


def imported_modules(path: Path) -> list[str]:
    """Every absolute module an import statement in `path` names, module-level or not."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def is_allowed(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def first_party_imports(package: str) -> list[tuple[str, str]]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for module in imported_modules(path):
            if module.split(".")[0] in FIRST_PARTY:
                found.append((str(path.relative_to(ROOT)), module))
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_layer_imports_only_the_layers_below_it(package: str) -> None:
    allowed = ALLOWED[package]
    # `from tts_service.engine import Engine` names both the package and the attribute; judge by the package.
    violations = [(path, module) for path, module in first_party_imports(package)
                  if not is_allowed(module, allowed) and not is_allowed(module.rsplit(".", 1)[0], allowed)]
    assert violations == []


def test_the_api_uses_the_engines_methods_and_never_its_runner_or_scheduler() -> None:
    reaching = []
    for path in sorted((ROOT / "tts_service/api").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ENGINE_INTERNALS:
                reaching.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    assert reaching == []


def test_the_layer_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    module = tmp_path / "server.py"
    module.write_text("from tts_service.runner.runner import ModelRunner\n")
    assert "tts_service.runner.runner" in imported_modules(module)
    assert not is_allowed("tts_service.runner.runner", ALLOWED["tts_service/api"])
