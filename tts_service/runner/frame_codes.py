"""One frame's codes from the talker's hidden state, as both the eager path and the frame step compute them:
codebook 0's logit processing in the reference's order, then the code predictor's 15 codebooks."""

from __future__ import annotations

from typing import Protocol

import torch

from tts_service.model.kernel_policy import KernelPolicy
from tts_service.model.talker import Talker
from tts_service.runner.sampling import TORCH_SAMPLER, RowSampling, Sampler, gumbel_noise, penalize_repetitions

# The top of the codec vocabulary holds control ids the talker must never emit (EOS excepted).
NUM_SUPPRESSED_IDS = 1024


def suppressed_ids_mask(talker: Talker) -> torch.Tensor:
    """The top 1024 codec ids are control tokens the talker must never emit, EOS excepted."""
    vocab = talker.config.layers.vocab_size
    mask = torch.zeros(vocab, dtype=torch.bool, device=talker.codec_head.weight.device)
    mask[max(0, vocab - NUM_SUPPRESSED_IDS):] = True
    mask[talker.config.codec_eos_id] = False
    return mask


def process_codebook0_logits(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor,
                             suppressed: torch.Tensor, eos_blocked: torch.Tensor, eos_id: int) -> torch.Tensor:
    """Reference order: repetition penalty, minimum length (EOS blocked), suppressed ids."""
    scores = penalize_repetitions(logits.float(), seen, penalty)
    scores[:, eos_id] = torch.where(eos_blocked, float("-inf"), scores[:, eos_id])
    return scores.masked_fill(suppressed, float("-inf"))


class PredictorMemory(Protocol):
    """The code predictor's key/value memory for one frame's short sequence."""

    def prepare(self, start: int, num_tokens: int) -> None: ...

    def __call__(self, layer_index: int, query: torch.Tensor, key: torch.Tensor,
                 value: torch.Tensor) -> torch.Tensor: ...


def predictor_hidden(talker: Talker, codebook: int, inputs: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                     memory: PredictorMemory) -> torch.Tensor:
    """The code predictor's last hidden state [B, H] for the call that predicts `codebook`: its `inputs` are the
    frame's first two tokens (codebook 1) or the previous codebook's embedding, at the positions that follow,
    rotated by `rope`, the predictor's `rope_table`."""
    batch, num_tokens = inputs.shape[:2]
    start = 0 if codebook == 1 else codebook
    memory.prepare(start, num_tokens)
    cos, sin = (table[:, start:start + num_tokens].expand(batch, -1, -1) for table in rope)
    return talker.code_predictor.hidden(inputs, cos, sin, memory)[:, -1]


class CodebookLogits(Protocol):
    """A whole predictor call in one: a codebook's inputs [B, T, talker width] in (the frame's first two tokens
    for codebook 1, else the previous codebook's embedding), the logits of each stream's last token out."""

    def logits(self, codebook: int, inputs: torch.Tensor) -> torch.Tensor: ...


def predict_remaining_codebooks(talker: Talker, talker_hidden: torch.Tensor, code0: torch.Tensor,
                                rows: RowSampling, seeds: torch.Tensor, draws: torch.Tensor,
                                memory: PredictorMemory, one_call: CodebookLogits | None = None,
                                code0_embedding: torch.Tensor | None = None,
                                sampler: Sampler = TORCH_SAMPLER) -> torch.Tensor:
    """Run the code predictor for one frame: [B] codebook 0 -> [B, G-1] codebooks 1..G-1.

    The sequence is [talker hidden, embed(code 0)] at positions 0-1, then one code per step. `one_call`, where
    `KernelPolicy.predictor_pass_rows` takes a call's rows (streams times tokens), computes that codebook in place
    of the layer-by-layer chain, with the same memory. `draws` [B] is each row's draw index for codebook 0
    (codebook g draws at draws + g), or [B, G-1] the draw indices of codebooks 1..G-1 where the caller laid them
    out; `code0_embedding` is code 0's embedding where the caller has it already. `sampler` draws the codes: the
    torch chain unless the caller hands the runner's kernels.
    """
    predictor = talker.code_predictor
    if code0_embedding is None:
        code0_embedding = talker.embed_codec(code0)
    inputs = torch.stack([talker_hidden, code0_embedding], dim=1)
    num_groups = talker.config.num_code_groups
    if draws.dim() == 1:
        draws = draws[:, None] + torch.arange(1, num_groups, device=code0.device)
    # Where the sampling kernel does not make its own noise, the noise of codebooks 1..G-1's draws is made at once,
    # [B, G-1, V]: one set of kernels instead of fifteen.
    gumbel: torch.Tensor | None = None
    codes: list[torch.Tensor] = []
    rope: tuple[torch.Tensor, torch.Tensor] | None = None  # made where the chain runs (some eight kernels)
    for codebook in range(1, num_groups):
        if one_call is not None and KernelPolicy.predictor_pass_rows(inputs.shape[0] * inputs.shape[1]):
            scores = one_call.logits(codebook, inputs)
        else:
            rope = rope or predictor.rope_table(num_groups, inputs.dtype)
            scores = predictor.logits(codebook, predictor_hidden(talker, codebook, inputs, rope, memory)).float()
        if gumbel is None and not sampler.makes_own_noise(scores):
            gumbel = gumbel_noise(seeds, draws, scores.shape[-1])
        noise = None if gumbel is None else gumbel[:, codebook - 1]
        if codebook + 1 < num_groups:
            code, embedded = sampler.sample_and_embed(scores, rows, seeds, draws[:, codebook - 1],
                                                      predictor.embedding_table(codebook), noise)
            inputs = embedded[:, None]
        else:
            code = sampler.sample(scores, rows, seeds, draws[:, codebook - 1], noise)
        codes.append(code)
    return torch.stack(codes, dim=1)
