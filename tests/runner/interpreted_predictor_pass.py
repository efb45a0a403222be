"""Checks of the one-kernel predictor call for Triton's interpreter, which must be on before Triton is imported
(its own library functions are kernels too): `test_predictor_pass` runs them in a fresh interpreter process with
TRITON_INTERPRET=1. One program runs, so the kernel's grid-wide barriers pass at once."""

from __future__ import annotations

import torch

from tts_service.model.checkpoint import LoadOptions
from tts_service.model.configs import ModelConfig, SpeechTokenizerConfig
from tts_service.model.loading import load_model
from tts_service.model.random_checkpoint import model_config_dict, random_modules, speech_tokenizer_config_dict
from tts_service.model.talker import Talker
from tts_service.runner.frame_codes import predictor_hidden
from tts_service.runner.frame_step import PredictorCache
from tts_service.runner.kv_cache import PagedKVCache
from tts_service.runner.predictor_pass import MAX_ROWS, PredictorPass

CPU = torch.device("cpu")


def packed_talker(same_width: bool = False) -> Talker:
    """The tiny talker, its predictor's projections packed; with `same_width`, a predictor as wide as the talker
    (as 0.6B's: no input projection)."""
    if same_width:
        raw = model_config_dict("tiny", "custom_voice")
        raw["talker_config"]["code_predictor_config"]["hidden_size"] = raw["talker_config"]["hidden_size"]
        speech = SpeechTokenizerConfig.parse(speech_tokenizer_config_dict("tiny"))
        talker = random_modules(ModelConfig.parse(raw), speech, CPU, seed=0, with_codec_encoder=False).talker
        assert not talker.config.has_mtp_projection
    else:
        talker = load_model("random:tiny-custom_voice", LoadOptions(device=CPU, dtype=torch.float32)).talker
    for layer in talker.code_predictor.model.layers:
        layer.self_attn.pack_projections()
        layer.mlp.pack_projections()
    return talker


@torch.inference_mode()
def check_one_call_matches_the_layer_chain(batch: int, same_width: int = 0) -> None:
    """In fp32, where only the order of each sum may differ: the chain's logits for codebooks 1-4 (codebook 1, the
    frame's first two tokens, where its rows fit the kernel's scratch), and the chain's keys and values stored at
    each codebook's positions (calls one after another: each finds its barrier count)."""
    talker = packed_talker(bool(same_width))
    predictor = talker.code_predictor
    shape = talker.config.code_predictor
    num_groups = talker.config.num_code_groups
    paged = PagedKVCache(shape.num_hidden_layers, batch, num_groups, shape.num_key_value_heads, shape.head_dim,
                         torch.float32, CPU)
    one_call = PredictorPass(talker, paged.storage, num_programs=1)
    memory = PredictorCache(talker, batch, torch.float32, CPU)
    rope = predictor.rope_table(num_groups, torch.float32)
    generator = torch.Generator().manual_seed(batch)
    hidden = torch.randn(batch, talker.config.layers.hidden_size, generator=generator)
    code = torch.randint(0, shape.vocab_size, (batch,), generator=generator)
    inputs = torch.stack([hidden, talker.embed_codec(code)], dim=1)
    chain = predictor.logits(1, predictor_hidden(talker, 1, inputs, rope, memory))
    if 2 * batch <= MAX_ROWS:
        assert_matches_the_chain(one_call.logits(1, inputs), chain, paged.storage, memory, batch, (0, 1))
    code = chain.argmax(-1)
    for codebook in (2, 3, 4):
        # The paged layout holds what the chain's memory holds for the positions before this one.
        paged.storage[:, 0, :batch, :codebook] = memory.keys[:, :batch, :, :codebook].transpose(2, 3)
        paged.storage[:, 1, :batch, :codebook] = memory.values[:, :batch, :, :codebook].transpose(2, 3)
        previous = predictor.embed(codebook - 1, code)[:, None]
        chain = predictor.logits(codebook, predictor_hidden(talker, codebook, previous, rope, memory))
        assert_matches_the_chain(one_call.logits(codebook, previous), chain, paged.storage, memory, batch,
                                 (codebook,))
        code = chain.argmax(-1)


def assert_matches_the_chain(logits: torch.Tensor, chain: torch.Tensor, storage: torch.Tensor,
                             memory: PredictorCache, batch: int, positions: tuple[int, ...]) -> None:
    torch.testing.assert_close(logits, chain, rtol=1e-5, atol=1e-6)
    for position in positions:
        for kind, held in ((0, memory.keys), (1, memory.values)):
            torch.testing.assert_close(storage[:, kind, :batch, position], held[:, :batch, :, position],
                                       rtol=1e-5, atol=1e-6)
