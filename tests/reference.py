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


def import_aligner_reference() -> types.ModuleType:
    """Import `qwen_asr` (qwen-asr, the forced aligner's oracle), skipping the calling test when it is not installed.

    Its aligner module imports nagisa at import time, only for Japanese word splitting, which the parity tests
    never reach; an inert stand-in takes its place when it is missing, as `sox` does for qwen-tts.
    """
    import importlib
    import importlib.machinery
    import importlib.util
    import sys

    pytest.importorskip("transformers")
    pytest.importorskip("librosa")
    if importlib.util.find_spec("qwen_asr") is None:
        pytest.skip("qwen-asr is not installed (pip install --no-deps qwen-asr==0.0.6)")
    if "nagisa" not in sys.modules and importlib.util.find_spec("nagisa") is None:
        stand_in = types.ModuleType("nagisa")
        stand_in.__spec__ = importlib.machinery.ModuleSpec("nagisa", loader=None)
        sys.modules["nagisa"] = stand_in
    try:
        return importlib.import_module("qwen_asr")
    except ImportError as error:
        pytest.skip(f"qwen-asr does not import: {error}")
