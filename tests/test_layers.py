"""The layers import only downward: api -> engine -> runner -> model, the scheduler beside them without torch,
and the served code never reaches into benchmarks, tests or the client package. Within a layer no module imports
one that imports it back, directly or through others (a type-only import counts: it is a dependency all the same).
Across layers no cycle can form, since each layer imports only those below it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# For each package, the first-party modules it may import (a prefix admits its submodules too).
ALLOWED: dict[str, tuple[str, ...]] = {
    # The word trackers cut text into words by the forced aligner's own rule (api/word_timestamps.py); the inline
    # clones are kept as the runner keeps its primed voices (model/recently_used.py, pure Python).
    "tts_service/api": ("tts_service.api", "tts_service.engine", "tts_service.audio", "tts_service.model.sources",
                        "tts_service.model.aligner_text", "tts_service.model.recently_used", "observability",
                        "qwen3_tts"),
    "tts_service/engine": ("tts_service.engine", "tts_service.runner", "tts_service.model", "scheduler",
                           "observability"),
    "tts_service/runner": ("tts_service.runner", "tts_service.model"),
    "tts_service/model": ("tts_service.model",),
    # The offline command takes the server's defaults from their one declaration (engine/config.py, no torch).
    "tts_service/eager": ("tts_service.eager", "tts_service.runner.params", "tts_service.runner.sampling",
                          "tts_service.runner.frame_codes", "tts_service.model", "tts_service.audio",
                          "tts_service.engine.config"),
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


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Each module under `package` -> the other modules under it that it imports."""
    files = {module_name(path, root): path for path in sorted((root / package).rglob("*.py"))}
    return {name: {module for module in imported_modules(path) if module in files and module != name}
            for name, path in files.items()}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """The modules `start` imports, directly or through others."""
    seen: set[str] = set()
    pending = list(graph[start])
    while pending:
        module = pending.pop()
        if module not in seen:
            seen.add(module)
            pending += graph[module]
    return seen


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others, each sorted."""
    reached = {module: reachable(graph, module) for module in graph}
    groups = {tuple(sorted(other for other in reached[module] if module in reached[other]))
              for module in graph if module in reached[module]}
    return sorted(list(group) for group in groups)


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


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_module_imports_one_that_imports_it_back(package: str) -> None:
    assert import_cycles(module_graph(ROOT, package)) == []


def test_the_front_doors_share_the_speech_steps_and_the_http_door_never_reaches_the_grpc_one() -> None:
    # The server, which builds the steps and both doors, may import the HTTP door; nothing else joins them.
    graph = module_graph(ROOT, "tts_service/api")
    http_door, grpc_door, steps = "tts_service.api.openai_http", "tts_service.api.server", "tts_service.api.speech"
    assert steps in reachable(graph, http_door)
    assert grpc_door not in reachable(graph, http_door)
    assert reachable(graph, steps).isdisjoint({http_door, grpc_door})


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


def test_the_cycle_check_sees_a_two_way_import_even_inside_a_function_or_for_types_only(tmp_path: Path) -> None:
    package = tmp_path / "model"
    package.mkdir()
    (package / "loader.py").write_text("def load():\n    from model.builder import build\n")
    (package / "builder.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                        "    from model.loader import load\n")
    (package / "configs.py").write_text("from model.loader import load\n")
    assert import_cycles(module_graph(tmp_path, "model")) == [["model.builder", "model.loader"]]
