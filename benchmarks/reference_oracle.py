"""Importing the official `qwen-tts` package (the parity oracle and the benchmark baseline).

Its 25 Hz tokenizer imports `sox` and `torchaudio` at import time; neither is on the 12 Hz path,
and torchaudio does not load beside every torch build, so inert stand-ins take their place when
they are missing. The reference is never imported by the service itself.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types

_UNUSED_ON_THE_12HZ_PATH = ("sox", "torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi")


def _install_inert_module(name: str) -> None:
    if name in sys.modules:
        return
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    sys.modules[name] = module


def import_qwen_tts() -> types.ModuleType:
    """Import `qwen_tts` with stand-ins for the 25 Hz stack's imports; raises ImportError when absent."""
    for name in _UNUSED_ON_THE_12HZ_PATH:
        _install_inert_module(name)
    return importlib.import_module("qwen_tts")
