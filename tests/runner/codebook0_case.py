"""Rows for the codebook-0 sampling kernel, and the check that it draws what the torch chain draws, shared by the
interpreter's test and the GPU's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tts_service.runner import sampling_kernel
from tts_service.runner.frame_codes import process_codebook0_logits
from tts_service.runner.sampling import RowSampling, sample_eager
from tts_service.runner.sampling_kernel import SlotTensors

NUM_GROUPS = 16


@dataclass
class Codebook0Case:
    logits: torch.Tensor
    state: SlotTensors
    slots: torch.Tensor
    frame_index: torch.Tensor
    suppressed: torch.Tensor
    eos_id: int
    table: torch.Tensor

    @classmethod
    def random(cls, vocab: int, device: torch.device, batch: int = 48, num_slots: int = 64) -> Codebook0Case:
        """Logits with ties, EOS's the largest (so only the minimum length keeps unblocked rows off it), suppressed
        ids, every sampling edge, penalties and seen histories, read through distinct slots."""
        generator = torch.Generator(device=device).manual_seed(vocab + 1)
        eos_id = vocab - 60
        logits = ((4 * torch.randn(batch, vocab, generator=generator, device=device)).round() / 4).bfloat16()
        logits[:, eos_id] = 8.0
        suppressed = torch.zeros(vocab, dtype=torch.bool, device=device)
        suppressed[vocab - 100:] = True
        suppressed[eos_id] = False

        def repeated(values: list[float], dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device).repeat(num_slots // len(values))

        shuffled = torch.randperm(num_slots, generator=generator, device=device)
        state = SlotTensors(
            temperature=repeated([0.0, 0.7, 1.0, 1.3]),
            top_k=repeated([0, 1, 50, 2 * vocab], torch.int64)[shuffled],
            top_p=torch.ones(num_slots, device=device),
            predictor_temperature=repeated([0.9, 0.0, 0.5, 1.1])[shuffled],
            predictor_top_k=repeated([50, 0, 7, 1], torch.int64),
            predictor_top_p=repeated([1.0, 0.8]),
            seeds=torch.randint(0, 2**62, (num_slots,), generator=generator, device=device),
            repetition_penalty=repeated([1.0, 1.05, 1.3, 2.0]),
            min_frames=torch.randint(0, 8, (num_slots,), generator=generator, device=device),
            seen=torch.rand(num_slots, vocab, generator=generator, device=device) < 0.3)
        slots = torch.randperm(num_slots, generator=generator, device=device)[:batch]
        frame_index = torch.randint(0, 8, (batch,), generator=generator, device=device)
        table = torch.randn(vocab, 40, generator=generator, device=device).bfloat16()
        return cls(logits, state, slots, frame_index, suppressed, eos_id, table)

    def check(self, gumbel_noise: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        """The kernel's ids, `seen` rows after the draw and embeddings against the chain's, whose noise for
        (seeds, draws) `gumbel_noise` makes; and the predictor's settings, seeds and draw indices it lays out for
        each row."""
        state, slots = self.state, self.slots
        blocked = self.frame_index < state.min_frames[slots]
        scores = process_codebook0_logits(self.logits, state.seen[slots], state.repetition_penalty[slots],
                                          self.suppressed, blocked, self.eos_id)
        rows = RowSampling(state.temperature[slots], state.top_k[slots], state.top_p[slots])
        expected = sample_eager(scores, rows, gumbel_noise(state.seeds[slots], self.frame_index * NUM_GROUPS))
        expected_seen = state.seen.clone()
        expected_seen[slots, expected] = True

        drawn = sampling_kernel.sample_codebook0(self.logits, slots, self.frame_index, state, self.suppressed,
                                                 self.eos_id, NUM_GROUPS, self.table)
        assert torch.equal(drawn.codes, expected), (drawn.codes != expected).nonzero().flatten().tolist()
        assert torch.equal(state.seen, expected_seen)
        assert torch.equal(drawn.embedding, self.table[expected])
        for got, per_slot in ((drawn.predictor_temperature, state.predictor_temperature),
                              (drawn.predictor_top_k, state.predictor_top_k),
                              (drawn.predictor_top_p, state.predictor_top_p), (drawn.seeds, state.seeds)):
            assert torch.equal(got, per_slot[slots])
        later = torch.arange(1, NUM_GROUPS, device=slots.device)
        assert torch.equal(drawn.draws, self.frame_index[:, None] * NUM_GROUPS + later)
        assert (expected[~blocked] == self.eos_id).any() and not (expected[blocked] == self.eos_id).any()
