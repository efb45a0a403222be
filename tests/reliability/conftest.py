"""Reliability tests print their figures (requests, errors, memory growth) at the end of the run. They use
the service tests' servers on the tiny models."""

from __future__ import annotations

import pytest

from tests.service.conftest import base_server, client, custom_voice_server  # noqa: F401 (fixtures)

_FIGURES: list[str] = []


@pytest.fixture
def report_figure() -> object:
    """Call with one line of figures; it is printed in the run's summary."""
    return _FIGURES.append


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _FIGURES:
        terminalreporter.section("reliability figures")
        for line in _FIGURES:
            terminalreporter.write_line(line)
