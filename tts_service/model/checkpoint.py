"""Loading a Qwen3-TTS 12 Hz checkpoint in the published layout, strictly.

A checkpoint is a local directory or a Hugging Face repo id (downloaded with huggingface_hub); `loading.load_model`
takes `random:<preset>` too. Every tensor in the files must be used, and every tensor the model needs must be present
with the right shape; anything else fails with the tensor names.

Random-weight models (`random_checkpoint`) are built by the same steps, through the public names here: `build_modules`
makes fresh modules of a config's shapes, `finish_loading` casts them and makes the `LoadedModel`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from tts_service.model.codec_decoder import CodecDecoder
from tts_service.model.codec_encoder import CodecEncoder
from tts_service.model.configs import ModelConfig, SpeechTokenizerConfig, describe_json
from tts_service.model.speaker_encoder import SpeakerEncoder
from tts_service.model.talker import Talker
from tts_service.model.text_tokenizer import TextTokenizerError, load_text_tokenizer

REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
    "tokenizer_config.json",
    "speech_tokenizer/config.json",
    "speech_tokenizer/preprocessor_config.json",
)
WEIGHT_FILES = ("model.safetensors", "speech_tokenizer/model.safetensors")
_DOWNLOAD_PATTERNS = ["*.json", "*.txt", "*.safetensors", "speech_tokenizer/*"]
_MAX_NAMES_SHOWN = 12
_FIRST_RETRY_DELAY_S = 1.0
_MAX_RETRY_DELAY_S = 30.0

logger = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be found, downloaded or loaded; the message says what to do."""


@dataclass(frozen=True)
class LoadOptions:
    """Where a model goes and in which dtypes: the talker's and encoders', and the codec decoder's own."""

    device: torch.device
    dtype: torch.dtype
    load_codec_encoder: bool = True
    # The codec decoder stays fp32 by default: in bf16 its waveform moves by up to ~0.08 from fp32 on random
    # weights, as the reference's own does in bf16 (BENCHMARKS.md, "codec fidelity"); bf16 is an opt-in.
    codec_decoder_dtype: torch.dtype = torch.float32
    # An fp32 decoder's residual units' convolutions read and write fp16 (CodecDecoder.use_half_convolutions).
    codec_half_convolutions: bool = False

    @classmethod
    def default_for(cls, device: str | torch.device, codec_decoder_dtype: str = "float32",
                    codec_convolution_dtype: str = "auto") -> LoadOptions:
        """bf16 on CUDA and fp32 elsewhere; the codec decoder in `codec_decoder_dtype` ("float32" or "bfloat16"), its
        residual units' convolutions in `codec_convolution_dtype`: "float32", "float16" (a float32 decoder only), or
        "auto", which is float16 for a float32 decoder on CUDA and float32 otherwise (on the CPU fp16 saves nothing,
        and tests there hold the decoder to exact fp32)."""
        device = torch.device(device)
        is_half = codec_convolution_dtype == "float16" or (
            codec_convolution_dtype == "auto" and device.type == "cuda" and codec_decoder_dtype == "float32")
        return cls(device=device, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32,
                   codec_decoder_dtype=getattr(torch, codec_decoder_dtype), codec_half_convolutions=is_half)


@dataclass
class LoadedModel:
    """Everything a runner needs, on its device and in its dtype."""

    source: str
    config: ModelConfig
    speech_config: SpeechTokenizerConfig
    generation_config: dict[str, Any]
    talker: Talker
    speaker_encoder: SpeakerEncoder | None
    codec_decoder: CodecDecoder
    codec_encoder: CodecEncoder | None
    tokenizer: Any
    is_random: bool = False

    @property
    def device(self) -> torch.device:
        return self.talker.codec_head.weight.device


def resolve_source(source: str, cache_dir: str | None = None, max_download_wait_s: float = 0.0) -> Path:
    """A local directory as is; otherwise a Hugging Face repo id, downloaded (or found in the cache). A download that
    fails for a reason that may pass (the Hub unreachable or overloaded) is retried with backoff for up to
    `max_download_wait_s`."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists() or source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise CheckpointError(f"model source {source!r} is neither a checkpoint directory nor a "
                              "Hugging Face repo id like 'Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice'")
    return download(source, cache_dir, max_download_wait_s)


def download(source: str, cache_dir: str | None, max_wait_s: float, sleep: Callable[[float], None] = time.sleep,
             clock: Callable[[], float] = time.monotonic) -> Path:
    """The repo's snapshot, retried with exponential backoff while its failure may pass and time is left."""
    from huggingface_hub import snapshot_download

    deadline = clock() + max_wait_s
    delay_s = _FIRST_RETRY_DELAY_S
    num_attempts = 0
    while True:
        num_attempts += 1
        try:
            return Path(snapshot_download(source, allow_patterns=_DOWNLOAD_PATTERNS, cache_dir=cache_dir))
        except Exception as error:
            if not is_transient_download_error(error) or clock() + delay_s > deadline:
                raise download_error(source, error, num_attempts) from error
            logger.warning("cannot download %s yet (%s): attempt %d failed, retrying in %g s for up to %g s in all",
                           source, _cause(error), num_attempts, delay_s, max_wait_s)
        sleep(delay_s)
        delay_s = min(2 * delay_s, _MAX_RETRY_DELAY_S)


def is_transient_download_error(error: Exception) -> bool:
    """Whether a download failed for a reason that may pass: the Hub unreachable, overloaded or rate limiting.
    Offline mode, a missing or gated repo, or a bad token do not pass by waiting."""
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    if isinstance(error, LocalEntryNotFoundError):  # the Hub could not be reached and the cache lacks the repo
        return not constants.HF_HUB_OFFLINE
    if isinstance(error, RepositoryNotFoundError):  # also a gated or private repo without access
        return False
    if isinstance(error, HfHubHTTPError):
        status = error.response.status_code if error.response is not None else None
        return status is None or status == 429 or status >= 500
    return isinstance(error, OSError)  # the HTTP client's connection errors


def download_error(source: str, error: Exception, num_attempts: int) -> CheckpointError:
    from huggingface_hub import constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    tried = f" after {num_attempts} attempts" if num_attempts > 1 else ""
    if isinstance(error, LocalEntryNotFoundError):
        why = ("HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the Hugging Face Hub is unreachable")
        return CheckpointError(
            f"cannot download {source!r}{tried}: {why} and the repo is not in the local cache. Download it where "
            f"the Hub is reachable (`huggingface-cli download {source} --local-dir DIR`) and pass --model DIR, or run "
            "with --model random:tiny-custom_voice to try the service with random weights.")
    return CheckpointError(f"cannot download {source!r}{tried}: {_cause(error)}")


def _cause(error: Exception) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def check_files(directory: Path) -> None:
    missing = [name for name in REQUIRED_FILES if not (directory / name).is_file()]
    missing += [name for name in WEIGHT_FILES if not _weight_files(directory / name)]
    if missing:
        raise CheckpointError(f"checkpoint {directory} is incomplete: missing {', '.join(missing)}")


def _weight_files(single: Path) -> list[Path]:
    """`model.safetensors`, or the shards named by `model.safetensors.index.json`."""
    if single.is_file():
        return [single]
    index = single.with_name(single.name + ".index.json")
    if not index.is_file():
        return []
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(shard, str) for shard in weight_map.values()):
        raise CheckpointError(f"{index}: weight_map must be an object from tensor names to shard file names, "
                              f"got {describe_json(weight_map)}")
    return [single.with_name(shard) for shard in sorted(set(weight_map.values()))]


def read_json(path: Path) -> dict[str, Any]:
    """A JSON file that must hold an object; anything else is a CheckpointError naming the file."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:  # ValueError: invalid JSON, or bytes that are not UTF-8
        raise CheckpointError(f"cannot read {path}: {error}") from error
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {describe_json(value)}")
    return value


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in _weight_files(path):
        try:
            with safe_open(file, framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 - safe_open handles are not iterable
                    tensors[name] = handle.get_tensor(name)
        except (OSError, SafetensorError) as error:
            raise CheckpointError(f"cannot read weights from {file}: {error}") from error
    return tensors


def _names(names: Iterable[str]) -> str:
    ordered = sorted(names)
    shown = ", ".join(ordered[:_MAX_NAMES_SHOWN])
    return shown + (f" (+{len(ordered) - _MAX_NAMES_SHOWN} more)" if len(ordered) > _MAX_NAMES_SHOWN else "")


def load_strict(module: nn.Module, tensors: Mapping[str, torch.Tensor], where: str) -> None:
    """Copy `tensors` into `module`; any missing, unexpected or mis-shaped tensor is an error."""
    expected = module.state_dict()
    problems = []
    if missing := expected.keys() - tensors.keys():
        problems.append(f"missing tensors: {_names(missing)}")
    if unexpected := tensors.keys() - expected.keys():
        problems.append(f"unexpected tensors: {_names(unexpected)}")
    wrong = [f"{name} {tuple(tensors[name].shape)} (expected {tuple(expected[name].shape)})"
             for name in expected.keys() & tensors.keys() if tensors[name].shape != expected[name].shape]
    if wrong:
        problems.append(f"mis-shaped tensors: {_names(wrong)}")
    if problems:
        raise CheckpointError(f"{where}: " + "; ".join(problems))
    module.load_state_dict(dict(tensors), strict=True)


def split_prefix(tensors: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {name[len(prefix):]: value for name, value in tensors.items() if name.startswith(prefix)}


def cast_weights_(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast parameters and persistent floating buffers; RoPE frequency tables stay fp32."""
    persistent = set(module.state_dict().keys())
    for parameter in module.parameters():
        if parameter.is_floating_point():
            parameter.data = parameter.data.to(dtype)
    for name, buffer in module.named_buffers():
        if name in persistent and buffer.is_floating_point():
            buffer.data = buffer.data.to(dtype)
    return module


@dataclass(frozen=True)
class ModelModules:
    """A model's modules as built, fp32 and trainable: what `build_modules` makes and `finish_loading` takes."""

    talker: Talker
    speaker_encoder: SpeakerEncoder | None
    codec_decoder: CodecDecoder
    codec_encoder: CodecEncoder | None


def needs_codec_encoder(config: ModelConfig, options: LoadOptions) -> bool:
    """Only voice cloning turns audio into codes; other models leave the encoder on disk."""
    return options.load_codec_encoder and config.model_type == "base"


def build_modules(config: ModelConfig, speech_config: SpeechTokenizerConfig, device: torch.device,
                  with_codec_encoder: bool) -> ModelModules:
    """Fresh modules in fp32 on `device`; weights are loaded or randomised afterwards."""
    with torch.device(device):
        return ModelModules(
            talker=Talker(config.talker),
            speaker_encoder=SpeakerEncoder(config.speaker_encoder) if config.speaker_encoder else None,
            codec_decoder=CodecDecoder(speech_config.decoder),
            codec_encoder=CodecEncoder(speech_config) if with_codec_encoder else None,
        )


def load_checkpoint(directory: Path, options: LoadOptions, source: str | None = None) -> LoadedModel:
    """The checkpoint in `directory`, strictly; `source` is the name the model goes by (the directory by default)."""
    check_files(directory)
    config = ModelConfig.parse(read_json(directory / "config.json"))
    speech_config = SpeechTokenizerConfig.parse(read_json(directory / "speech_tokenizer/config.json"))
    modules = build_modules(config, speech_config, options.device, needs_codec_encoder(config, options))

    model_tensors = read_tensors(directory / "model.safetensors")
    talker_tensors = split_prefix(model_tensors, "talker.")
    speaker_tensors = split_prefix(model_tensors, "speaker_encoder.")
    stray = {name for name in model_tensors if not name.startswith(("talker.", "speaker_encoder."))}
    if stray:
        raise CheckpointError(f"model.safetensors: unexpected tensors: {_names(stray)}")
    load_strict(modules.talker, talker_tensors, "model.safetensors (talker)")
    if modules.speaker_encoder is not None:
        load_strict(modules.speaker_encoder, speaker_tensors, "model.safetensors (speaker_encoder)")
    elif speaker_tensors:
        raise CheckpointError(f"model.safetensors: a {config.model_type} checkpoint holds speaker-encoder "
                              f"tensors: {_names(speaker_tensors)}")

    codec_tensors = read_tensors(directory / "speech_tokenizer/model.safetensors")
    stray = {name for name in codec_tensors if not name.startswith(("decoder.", "encoder."))}
    if stray:
        raise CheckpointError(f"speech_tokenizer/model.safetensors: unexpected tensors: {_names(stray)}")
    load_strict(modules.codec_decoder, split_prefix(codec_tensors, "decoder."),
                "speech_tokenizer/model.safetensors (decoder)")
    if modules.codec_encoder is not None:
        load_strict(modules.codec_encoder, split_prefix(codec_tensors, "encoder."),
                    "speech_tokenizer/model.safetensors (encoder)")

    try:
        tokenizer = load_text_tokenizer(directory)
    except TextTokenizerError as error:  # it names the broken file
        raise CheckpointError(str(error)) from None
    return finish_loading(source or str(directory), config, speech_config,
                          read_json(directory / "generation_config.json"), modules, tokenizer, options)


def finish_loading(source: str, config: ModelConfig, speech_config: SpeechTokenizerConfig,
                   generation_config: dict[str, Any], modules: ModelModules, tokenizer: Any,
                   options: LoadOptions, is_random: bool = False) -> LoadedModel:
    """The last step of every load: `modules`, weights in place, cast to the dtypes of `options` and frozen for
    inference, with what the runner needs beside them."""
    for module in (modules.talker, modules.speaker_encoder, modules.codec_encoder):
        if module is not None:
            cast_weights_(module, options.dtype).eval().requires_grad_(False)
    cast_weights_(modules.codec_decoder, options.codec_decoder_dtype).eval().requires_grad_(False)
    modules.codec_decoder.use_half_convolutions(options.codec_half_convolutions)
    return LoadedModel(
        source=source,
        config=config,
        speech_config=speech_config,
        generation_config=generation_config,
        talker=modules.talker,
        speaker_encoder=modules.speaker_encoder,
        codec_decoder=modules.codec_decoder,
        codec_encoder=modules.codec_encoder,
        tokenizer=tokenizer,
        is_random=is_random,
    )
