"""One entry point for every model source: a checkpoint directory, a Hugging Face repo id, or `random:<preset>`.

It sits above the strict loader (`checkpoint`) and the random-weight builder (`random_checkpoint`), which builds its
models with the loader's public steps: so the loader never imports the builder back.
"""

from __future__ import annotations

from tts_service.model.checkpoint import LoadedModel, LoadOptions, load_checkpoint, resolve_source
from tts_service.model.random_checkpoint import build_random_model


def load_model(source: str, options: LoadOptions, cache_dir: str | None = None,
               max_download_wait_s: float = 0.0) -> LoadedModel:
    """Load a model from a directory, a Hugging Face repo id, or `random:<preset>`; exactly that model."""
    if source.startswith("random:"):
        return build_random_model(source.removeprefix("random:"), options)
    return load_checkpoint(resolve_source(source, cache_dir, max_download_wait_s), options, source)
