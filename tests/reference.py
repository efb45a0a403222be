"""Access to the official `qwen-tts` package, the test oracle for parity."""

from __future__ import annotations

import types

import pytest

from benchmarks.reference_oracle import import_qwen_tts


def import_reference() -> types.ModuleType:
    """Import `qwen_tts`, skipping the calling test when the parity extra is not installed."""
    pytest.importorskip("transformers")
    try:
        return import_qwen_tts()
    except ImportError as error:
        pytest.skip(f"qwen-tts is not installed: {error}")
