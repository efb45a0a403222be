"""Access to the official `qwen-tts` package, the test oracle for parity.

Its 25 Hz tokenizer imports `sox` and `torchaudio` at import time; neither is on the 12 Hz path
and torchaudio does not load beside the CPU torch used in CI, so inert stand-ins take their place.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest


def _install_inert_module(name: str) -> None:
    if name in sys.modules:
        return
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    sys.modules[name] = module


def import_reference() -> types.ModuleType:
    """Import `qwen_tts`, skipping the calling test when the parity extra is not installed."""
    pytest.importorskip("transformers")
    for name in ("sox", "torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"):
        _install_inert_module(name)
    return pytest.importorskip("qwen_tts")
