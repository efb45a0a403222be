"""Teacher-forced logit fidelity in bf16: is the engine's path as close to fp32 as the reference is?

    python -m benchmarks.fidelity --checkpoint DIR --out bench-results/fidelity.json

One fixed sequence of frames (random codes and text ids, embedded in fp32 by the reference's own
modules) is fed to three systems, teacher-forced, and every logit they produce is compared with
the reference `qwen-tts` run in fp32:
- the reference in bf16 (the bar to meet),
- this service in bf16 on the engine's path: the talker one position at a time through the paged
  decode attention, the code predictor one codebook at a time through its static cache, all
  frames of the sequence as one batch; once with the fused kernels and once with the eager chain;
- and, on CUDA, the path a single stream takes: each frame alone, the predictor's codebooks 2-15
  each one kernel (`PredictorPass`).
Codebook 0 comes from the talker head, codebooks 1-15 from the predictor fed each system's own
talker hidden state and the forced codes. Needs the qwen-tts package (the parity extra).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from benchmarks.reference_oracle import import_qwen_tts
from tts_service.model.checkpoint import LoadOptions
from tts_service.model.kernel_policy import KernelPolicy
from tts_service.model.layers import use_fused_kernels
from tts_service.model.loading import load_model
from tts_service.model.talker import Talker
from tts_service.runner.frame_codes import predictor_hidden
from tts_service.runner.frame_step import PagedPredictorCache, PredictorCache, predictor_call
from tts_service.runner.kv_cache import PagedDecodeBackend, PagedKVCache

_BLOCK_SIZE = 32
# Both systems round differently from one run to the next only by summation order; a margin this
# small still fails any change that makes the path measurably worse than the reference in bf16.
_TOLERANCE = 1.10


@dataclass(frozen=True)
class LogitError:
    mean_abs: float
    max_abs: float
    mean_kl: float  # KL(fp32 reference || system), nats per position
    argmax_agreement: float


@dataclass(frozen=True)
class TeacherForcedLogits:
    codebook0: torch.Tensor  # [L, V0] fp32
    predictor: torch.Tensor  # [L, G-1, V] fp32


def logit_error(logits: torch.Tensor, reference: torch.Tensor) -> LogitError:
    reference_log_probs = torch.log_softmax(reference, dim=-1)
    kl = (reference_log_probs.exp() * (reference_log_probs - torch.log_softmax(logits, dim=-1))).sum(-1)
    difference = (logits - reference).abs()
    return LogitError(mean_abs=difference.mean().item(), max_abs=difference.max().item(), mean_kl=kl.mean().item(),
                      argmax_agreement=(logits.argmax(-1) == reference.argmax(-1)).float().mean().item())


@torch.inference_mode()
def reference_inputs(talker: torch.nn.Module, num_positions: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Forced codes [L, G] and their fp32 input embeddings [L, H], summed as the reference feeds a frame."""
    generator = torch.Generator().manual_seed(seed)
    config = talker.config
    device = talker.codec_head.weight.device
    codes = torch.randint(0, config.code_predictor_config.vocab_size, (num_positions, config.num_code_groups),
                          generator=generator).to(device)
    text_ids = torch.randint(0, config.text_vocab_size, (num_positions,), generator=generator).to(device)
    embeds = talker.model.codec_embedding(codes[:, 0])
    for codebook in range(1, config.num_code_groups):
        embeds = embeds + talker.code_predictor.model.codec_embedding[codebook - 1](codes[:, codebook])
    return codes, embeds + talker.text_projection(talker.model.text_embedding(text_ids))


@torch.inference_mode()
def reference_logits(talker: torch.nn.Module, embeds: torch.Tensor, codes: torch.Tensor) -> TeacherForcedLogits:
    dtype = talker.codec_head.weight.dtype
    hidden = talker.model(inputs_embeds=embeds.to(dtype)[None]).last_hidden_state[0]
    predictor_logits, _ = talker.forward_sub_talker_finetune(codes, hidden)
    return TeacherForcedLogits(talker.codec_head(hidden).float(), predictor_logits.float())


@torch.inference_mode()
def engine_path_logits(talker: Talker, embeds: torch.Tensor, codes: torch.Tensor) -> TeacherForcedLogits:
    talker_hidden = engine_talker_hidden(talker, embeds)
    return TeacherForcedLogits(talker.logits(talker_hidden).float(), predictor_logits(talker, talker_hidden, codes))


def engine_talker_hidden(talker: Talker, embeds: torch.Tensor) -> torch.Tensor:
    """The talker's hidden state at every position [L, H], one decode step at a time on the paged cache."""
    device, dtype = embeds.device, talker.codec_head.weight.dtype
    layers = talker.config.layers
    num_positions = embeds.shape[0]
    num_blocks = -(-num_positions // _BLOCK_SIZE)
    cache = PagedKVCache(layers.num_hidden_layers, num_blocks, _BLOCK_SIZE, layers.num_key_value_heads,
                         layers.head_dim, dtype, device)
    backend = PagedDecodeBackend(cache, max_batch_size=1, max_blocks_per_seq=num_blocks)
    block_table = torch.arange(num_blocks, dtype=torch.int32, device=device)[None]
    hidden = []
    for position in range(num_positions):
        backend.set_metadata(block_table, torch.tensor([position], device=device))
        positions = torch.tensor([[position]], device=device)
        hidden.append(talker.hidden(embeds[position].to(dtype)[None, None], positions, backend)[0, -1])
    return torch.stack(hidden)


def predictor_logits(talker: Talker, talker_hidden: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """Every frame as one batch row, one codebook per call, as the engine's frame step runs it."""
    predictor = talker.code_predictor
    memory = PredictorCache(talker, codes.shape[0], talker_hidden.dtype, talker_hidden.device)
    inputs = torch.stack([talker_hidden, talker.embed_codec(codes[:, 0])], dim=1)
    logits = []
    rope = predictor.rope_table(talker.config.num_code_groups, inputs.dtype)
    for codebook in range(1, talker.config.num_code_groups):
        hidden = predictor_hidden(talker, codebook, inputs, rope, memory)
        logits.append(predictor.logits(codebook, hidden).float())
        inputs = predictor.embed(codebook, codes[:, codebook])[:, None]
    return torch.stack(logits, dim=1)


@torch.inference_mode()
def one_call_logits(talker: Talker, embeds: torch.Tensor, codes: torch.Tensor) -> TeacherForcedLogits | None:
    """The engine's path at batch 1, where each of the code predictor's calls runs as one kernel (`PredictorPass`),
    the frame's first, with its two tokens, too: every frame on its own, as the frame step runs it. None where the
    kernel does not serve this device or model."""
    dtype, device = talker.codec_head.weight.dtype, embeds.device
    memory = PagedPredictorCache(talker, 1, dtype, device)
    call = predictor_call(talker, memory, KernelPolicy.build(device, dtype))
    if call is None:
        return None
    talker_hidden = engine_talker_hidden(talker, embeds)
    predictor = talker.code_predictor
    num_groups = talker.config.num_code_groups
    logits = torch.empty(codes.shape[0], num_groups - 1, predictor.lm_head[0].out_features, device=device)
    for frame in range(codes.shape[0]):
        inputs = torch.stack([talker_hidden[frame:frame + 1], talker.embed_codec(codes[frame:frame + 1, 0])], dim=1)
        for codebook in range(1, num_groups):
            logits[frame, codebook - 1] = call.logits(codebook, inputs)[0]
            inputs = predictor.embed(codebook, codes[frame:frame + 1, codebook])[:, None]
    return TeacherForcedLogits(talker.logits(talker_hidden).float(), logits)


def compare(system: TeacherForcedLogits, reference: TeacherForcedLogits) -> dict:
    return {"codebook0": asdict(logit_error(system.codebook0, reference.codebook0)),
            "codebooks_1_15": asdict(logit_error(system.predictor, reference.predictor))}


def is_within_bar(system: dict, bar: dict) -> bool:
    return all(system[part][metric] <= bar[part][metric] * _TOLERANCE
               for part in ("codebook0", "codebooks_1_15") for metric in ("mean_abs", "mean_kl"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--positions", type=int, default=160)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    qwen_tts = import_qwen_tts()

    def load_reference(dtype: torch.dtype) -> torch.nn.Module:
        model = qwen_tts.Qwen3TTSModel.from_pretrained(str(args.checkpoint), dtype=dtype, device_map=args.device)
        return model.model.talker

    reference32 = load_reference(torch.float32)
    codes, embeds = reference_inputs(reference32, args.positions, args.seed)
    truth = reference_logits(reference32, embeds, codes)
    del reference32
    if device.type == "cuda":
        torch.cuda.empty_cache()
    results = {"reference_bf16": compare(reference_logits(load_reference(torch.bfloat16), embeds, codes), truth)}
    talker = load_model(str(args.checkpoint), LoadOptions(device=device, dtype=torch.bfloat16,
                                                          load_codec_encoder=False)).talker
    for name, is_fused in (("engine_bf16_fused", True), ("engine_bf16_eager_chain", False)):
        use_fused_kernels(talker, is_fused)
        results[name] = compare(engine_path_logits(talker, embeds, codes), truth)
    use_fused_kernels(talker, True)
    one_call = one_call_logits(talker, embeds, codes)
    if one_call is not None:
        results["engine_bf16_fused_batch1_one_call"] = compare(one_call, truth)
    verdicts = {name: is_within_bar(results[name], results["reference_bf16"])
                for name in results if name.startswith("engine_")}
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    report = {"benchmark": "fidelity", "device": device_name, "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "checkpoint": str(args.checkpoint), "positions": args.positions,
              "command": " ".join(["python -m benchmarks.fidelity", *(argv or sys.argv[1:])]),
              "tolerance_vs_reference_bf16": _TOLERANCE, "errors_vs_reference_fp32": results,
              "within_reference_bf16": verdicts}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    lines = [f"{'system':<26} {'part':<15} {'mean abs':>9} {'max abs':>8} {'mean KL':>9} {'argmax =':>8}"]
    for name, parts in results.items():
        lines += [f"{name:<26} {part:<15} {e['mean_abs']:>9.5f} {e['max_abs']:>8.4f} {e['mean_kl']:>9.2e} "
                  f"{e['argmax_agreement']:>8.3f}" for part, e in parts.items()]
    lines.append(f"within the reference's own bf16 error (x{_TOLERANCE}): {verdicts}")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0 if all(verdicts.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
