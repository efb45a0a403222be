"""Reliability tests print their figures (requests, errors, memory growth) at the end of the run."""

from __future__ import annotations

import pytest

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
