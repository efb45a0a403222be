"""The codec decoder: parity with the reference decoder, and chunked streaming equal to one-shot decoding up to
float rounding."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from benchmarks.codec_fidelity import waveform_error
from tests.reference import import_reference
from tts_service.model.codec_decoder import (
    CausalConv1d,
    CausalConvTranspose1d,
    CodecDecoder,
    CodecStreamState,
    ResidualUnit,
)
from tts_service.model.configs import CodecDecoderConfig, SpeechTokenizerConfig
from tts_service.model.random_checkpoint import speech_tokenizer_config_dict

TOLERANCE = 1e-4

# Small enough for CPU tests, with the real upsampling (1920 samples a frame), grouped-query
# attention, a head_dim that is not hidden / heads, and a window of 8 frames so streams wrap it.
SMALL = {
    "codebook_size": 64, "codebook_dim": 32, "latent_dim": 64, "decoder_dim": 96, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 24, "sliding_window": 8, "num_quantizers": 16, "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2],
}

# `decoder_config` of the speech_tokenizer/config.json shared by every released 12 Hz checkpoint.
RELEASED = speech_tokenizer_config_dict("1.7b")["decoder_config"]


FRAMES = 300


def random_codes(config: CodecDecoderConfig, batch: int, frames: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.codebook_size, (batch, config.num_quantizers, frames), generator=generator)


def random_decoder(config: CodecDecoderConfig, seed: int = 0) -> CodecDecoder:
    decoder = CodecDecoder(config).eval()
    decoder.randomize_(torch.Generator().manual_seed(seed))
    return decoder


def reference_decoder(raw_decoder_config: dict) -> torch.nn.Module:
    import_reference()
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model

    config = Qwen3TTSTokenizerV2Config(decoder_config=raw_decoder_config)
    return Qwen3TTSTokenizerV2Model(config).decoder.eval()


def assert_audible(wave: torch.Tensor) -> None:
    """Random weights must give a waveform a parity check can see: neither silence nor a clipped square."""
    rms = wave.pow(2).mean().sqrt().item()
    assert 0.02 < rms < 0.8, rms
    assert (wave.abs() >= 1).float().mean().item() < 0.05
    assert wave.flatten(1).std(dim=1).min().item() > 0.01


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a - b).abs().max().item()


@pytest.fixture(scope="module", autouse=True)
def single_intra_op_thread() -> Iterator[None]:
    # Streaming runs thousands of tiny ops, where a second intra-op thread only adds barrier waits
    # (over 10x slower here on a busy 2-core machine); one thread keeps this file's time predictable.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def small_config() -> CodecDecoderConfig:
    return CodecDecoderConfig.parse(SMALL)


@pytest.fixture(scope="module")
def small_decoder(small_config: CodecDecoderConfig) -> CodecDecoder:
    return random_decoder(small_config)


@pytest.fixture(scope="module")
def long_codes(small_config: CodecDecoderConfig) -> torch.Tensor:
    return random_codes(small_config, batch=1, frames=FRAMES, seed=1)


@pytest.fixture(scope="module")
def long_one_shot(small_decoder: CodecDecoder, long_codes: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return small_decoder(long_codes)


@pytest.fixture(scope="module")
def small_reference(small_decoder: CodecDecoder) -> torch.nn.Module:
    return reference_decoder(SMALL)


# --- parity with the reference ------------------------------------------------------------------------

@pytest.mark.parity
def test_state_dict_names_and_shapes_equal_the_reference_decoder(small_decoder: CodecDecoder,
                                                                 small_reference: torch.nn.Module) -> None:
    ours = [(name, tuple(t.shape)) for name, t in small_decoder.state_dict().items()]
    theirs = [(name, tuple(t.shape)) for name, t in small_reference.state_dict().items()]
    assert ours == theirs
    CodecDecoder(small_decoder.config).load_state_dict(small_reference.state_dict(), strict=True)


@pytest.mark.parity
def test_one_shot_decode_equals_the_reference(small_config: CodecDecoderConfig, small_decoder: CodecDecoder,
                                              small_reference: torch.nn.Module, long_codes: torch.Tensor,
                                              long_one_shot: torch.Tensor) -> None:
    small_reference.load_state_dict(small_decoder.state_dict(), strict=True)
    with torch.no_grad():
        expected = small_reference(long_codes)
    assert long_one_shot.shape == (1, 1, FRAMES * small_config.samples_per_frame)
    assert max_diff(long_one_shot, expected) <= TOLERANCE
    assert_audible(long_one_shot)


@pytest.mark.parity
def test_released_config_decode_equals_the_reference() -> None:
    config = SpeechTokenizerConfig.parse({"decoder_config": RELEASED}).decoder
    decoder = random_decoder(config)
    reference = reference_decoder(RELEASED)
    reference.load_state_dict(decoder.state_dict(), strict=True)
    codes = random_codes(config, batch=1, frames=10, seed=2)
    with torch.no_grad():
        ours, expected = decoder(codes), reference(codes)
    assert ours.shape == (1, 1, 10 * 1920)
    assert max_diff(ours, expected) <= TOLERANCE
    assert_audible(ours)


# --- streaming ----------------------------------------------------------------------------------------

def decode_in_chunks(decoder: CodecDecoder, codes: torch.Tensor, chunk: int,
                     state: CodecStreamState | None = None) -> torch.Tensor:
    state = decoder.new_stream_state(codes.shape[0]) if state is None else state
    pieces = [decoder.decode_chunk(codes[:, :, start:start + chunk], state)
              for start in range(0, codes.shape[2], chunk)]
    return torch.cat(pieces, dim=-1)


@pytest.mark.parametrize("chunk", [1, 4, 25])
def test_chunked_streaming_equals_one_shot(small_decoder: CodecDecoder, long_codes: torch.Tensor,
                                           long_one_shot: torch.Tensor, chunk: int) -> None:
    state = small_decoder.new_stream_state(1)
    streamed = decode_in_chunks(small_decoder, long_codes, chunk, state)
    assert max_diff(streamed, long_one_shot[:, 0]) <= TOLERANCE
    assert state.position.tolist() == [FRAMES]


def test_decode_chunk_updates_state_in_place(small_config: CodecDecoderConfig,
                                             small_decoder: CodecDecoder) -> None:
    state = small_decoder.new_stream_state(2)
    before = [(t.data_ptr(), t.shape) for t in state.tensors()]
    snapshot = [t.clone() for t in state.tensors()]
    out = small_decoder.decode_chunk(random_codes(small_config, 2, 3, seed=3), state)
    assert out.shape == (2, 3 * small_config.samples_per_frame)
    assert [(t.data_ptr(), t.shape) for t in state.tensors()] == before
    changed = [not torch.equal(old, new) for old, new in zip(snapshot, state.tensors(), strict=True)]
    assert all(changed), "every piece of state should carry something after a chunk"


def stack_states(states: list[CodecStreamState]) -> CodecStreamState:
    return CodecStreamState(position=torch.cat([s.position for s in states]),
                            keys=torch.cat([s.keys for s in states], dim=1),
                            values=torch.cat([s.values for s in states], dim=1),
                            conv=tuple(torch.cat(parts) for parts in zip(*(s.conv for s in states), strict=True)))


def test_batched_rows_at_different_positions_decode_like_each_alone(small_config: CodecDecoderConfig,
                                                                     small_decoder: CodecDecoder) -> None:
    prefixes, frames, chunk = (0, 5, 13), 24, 4
    streams = [random_codes(small_config, 1, prefix + frames, seed=10 + row)
               for row, prefix in enumerate(prefixes)]
    states = []
    for prefix, codes in zip(prefixes, streams, strict=True):
        state = small_decoder.new_stream_state(1)
        if prefix:
            small_decoder.decode_chunk(codes[:, :, :prefix], state)
        states.append(state)
    batch_state = stack_states(states)
    together = torch.cat([codes[:, :, prefix:] for prefix, codes in zip(prefixes, streams, strict=True)])
    streamed = decode_in_chunks(small_decoder, together, chunk, batch_state)

    spf = small_config.samples_per_frame
    for row, (prefix, codes) in enumerate(zip(prefixes, streams, strict=True)):
        with torch.no_grad():
            alone = small_decoder(codes)[0, 0, prefix * spf:]
        assert max_diff(streamed[row], alone) <= TOLERANCE, f"row {row}"


def test_reset_rows_makes_a_reused_row_decode_like_a_fresh_stream(small_config: CodecDecoderConfig,
                                                                  small_decoder: CodecDecoder) -> None:
    first, second, chunk = 20, 20, 5
    old = random_codes(small_config, 2, first, seed=20)
    new = random_codes(small_config, 2, second, seed=21)
    state = small_decoder.new_stream_state(2)
    decode_in_chunks(small_decoder, old, chunk, state)
    state.reset_rows(torch.tensor([0]))
    streamed = decode_in_chunks(small_decoder, new, chunk, state)
    assert state.position.tolist() == [second, first + second]

    spf = small_config.samples_per_frame
    with torch.no_grad():
        fresh = small_decoder(new[:1])[0, 0]
        continued = small_decoder(torch.cat([old[1:], new[1:]], dim=2))[0, 0, first * spf:]
    assert max_diff(streamed[0], fresh) <= TOLERANCE
    assert max_diff(streamed[1], continued) <= TOLERANCE


def test_codes_with_the_wrong_number_of_quantizers_are_rejected(small_config: CodecDecoderConfig,
                                                               small_decoder: CodecDecoder) -> None:
    codes = random_codes(small_config, 1, 2, seed=4)[:, :-1]
    with pytest.raises(ValueError, match="expected codes"):
        small_decoder.decode_chunk(codes, small_decoder.new_stream_state(1))


def test_packed_projections_decode_like_separate_ones(small_config: CodecDecoderConfig,
                                                      small_decoder: CodecDecoder) -> None:
    """On CUDA the pre-transformer computes q/k/v and gate/up as one GEMM each over packed weights; here the
    packing is done by hand, since the kernels that switch it on need a GPU."""
    packed = random_decoder(small_config)
    assert packed.use_fused_kernels(True) > 0
    for module in packed.pre_transformer.modules():
        if hasattr(module, "pack_projections"):
            module.pack_projections()
    assert all(layer.self_attn.qkv_weight is not None and layer.mlp.gate_up_weight is not None
               for layer in packed.pre_transformer.layers)
    codes = random_codes(small_config, 2, 3, seed=6)
    with torch.no_grad():
        assert max_diff(packed(codes), small_decoder(codes)) <= 1e-6


@pytest.mark.parametrize("share_rings", [False, True], ids=["copied", "rings-in-place"])
def test_selected_rows_decode_and_store_back_like_the_whole_state(small_config: CodecDecoderConfig,
                                                                  small_decoder: CodecDecoder,
                                                                  share_rings: bool) -> None:
    """The runner decodes a call's rows from a copy of their state (the attention's rings copied too, or read and
    written in place) and writes it back: those rows must advance as if the whole state had decoded them, and the
    others must not move."""
    whole = small_decoder.new_stream_state(3)
    small_decoder.decode_chunk(random_codes(small_config, 3, 2, seed=8), whole)
    partial = CodecStreamState(position=whole.position.clone(), keys=whole.keys.clone(), values=whole.values.clone(),
                               conv=tuple(t.clone() for t in whole.conv))
    untouched = [t.select(dim, 1).clone() for t, dim in zip(partial.tensors(), (0, 1, 1, *(0,) * len(partial.conv)),
                                                             strict=True)]
    second = random_codes(small_config, 3, 2, seed=9)
    expected = small_decoder.decode_chunk(second, whole)
    rows = torch.tensor([2, 0])
    selected = partial.select_rows(rows, share_rings=share_rings)
    assert (selected.keys is partial.keys) == share_rings
    assert max_diff(small_decoder.decode_chunk(second[rows], selected), expected[rows]) <= TOLERANCE
    partial.store_rows(rows, selected)
    for stored, reference, before, dim in zip(partial.tensors(), whole.tensors(), untouched,
                                              (0, 1, 1, *(0,) * len(partial.conv)), strict=True):
        assert torch.equal(stored.select(dim, 1), before)
        for row in (0, 2):
            assert max_diff(stored.select(dim, row).double(), reference.select(dim, row).double()) <= TOLERANCE
    assert partial.position.tolist() == [4, 2, 4]


# --- half-precision convolutions ------------------------------------------------------------------------

def signal_to_error_db(wave: torch.Tensor, exact: torch.Tensor) -> float:
    """As the codec fidelity benchmark measures it."""
    return waveform_error(wave, exact)["snr_db"]


def test_half_convolutions_move_the_waveform_about_as_far_as_tf32_does(small_config: CodecDecoderConfig) -> None:
    decoder = random_decoder(small_config)
    codes = random_codes(small_config, batch=2, frames=12, seed=3)
    with torch.no_grad():
        exact = decoder(codes)
        decoder.use_half_convolutions(True)
        half = decoder(codes)
    assert_audible(half)
    # TF32 is about 50 dB from exact fp32 on the released decoder's shape (BENCHMARKS.md); fp16 rounds the
    # convolutions' inputs to the same mantissa, and their outputs once more.
    assert 40 < signal_to_error_db(half, exact) < 80


@pytest.mark.parametrize("chunk", [1, 5])
def test_half_convolution_streams_equal_their_one_shot_decode(small_config: CodecDecoderConfig, chunk: int) -> None:
    decoder = random_decoder(small_config)
    codes = random_codes(small_config, batch=2, frames=12, seed=4)
    with torch.no_grad():
        exact = decoder(codes)[:, 0]
        decoder.use_half_convolutions(True)
        one_shot = decoder(codes)[:, 0]
        streamed = decode_in_chunks(decoder, codes, chunk)
    # Another chunk length sums in another order, which can tip an output's rounding to fp16 the other way
    # (these codes do so once, with chunks of one frame); the streamed waveform is as near exact as the one shot.
    assert signal_to_error_db(streamed, one_shot) > 50
    assert abs(signal_to_error_db(streamed, exact) - signal_to_error_db(one_shot, exact)) < 0.5


def test_every_convolution_but_the_last_can_run_in_fp16_and_still_streams_as_it_decodes_at_once(
        small_config: CodecDecoderConfig) -> None:
    """The per-layer switch works for each kind of layer (the first version of this change narrowed them all), not
    only for the residual units `use_half_convolutions` picks: transposed convolutions, depthwise ones, and those
    whose input is not an activation's."""
    decoder = random_decoder(small_config)
    codes = random_codes(small_config, batch=2, frames=12, seed=4)
    *convolutions, last = [m for m in decoder.modules() if isinstance(m, CausalConv1d | CausalConvTranspose1d)]
    assert last is decoder.decoder[-1]
    with torch.no_grad():
        exact = decoder(codes)[:, 0]
        for module in convolutions:
            module.input_dtype = torch.float16
        one_shot = decoder(codes)[:, 0]
        streamed = decode_in_chunks(decoder, codes, 1)
    assert {t.dtype for t in decoder.new_stream_state(1).conv} == {torch.float16, torch.float32}
    assert 40 < signal_to_error_db(one_shot, exact) < 80
    assert signal_to_error_db(streamed, one_shot) > 45
    assert abs(signal_to_error_db(streamed, exact) - signal_to_error_db(one_shot, exact)) < 0.5


def test_half_convolutions_cover_the_residual_units_and_keep_their_history_in_fp16(
        small_config: CodecDecoderConfig) -> None:
    decoder = random_decoder(small_config)
    num_switched = decoder.use_half_convolutions(True)
    units = [m for m in decoder.modules() if isinstance(m, ResidualUnit)]
    in_units = {id(unit.conv1) for unit in units} | {id(unit.conv2) for unit in units}
    convolutions = [m for m in decoder.modules() if isinstance(m, CausalConv1d | CausalConvTranspose1d)]
    assert num_switched == len(in_units) == 4 * 3 * 2  # per block, three units of two convolutions
    for module in convolutions:
        assert module.stored_dtype() == (torch.float16 if id(module) in in_units else torch.float32)
    state = decoder.new_stream_state(2)
    with_history = [m for m in convolutions if m.state_shape()]
    assert [t.dtype for t in state.conv] == [m.stored_dtype() for m in with_history]
    assert {t.dtype for t in state.conv} == {torch.float16, torch.float32}
    assert state.keys.dtype == torch.float32
    decoder.use_half_convolutions(False)
    assert {t.dtype for t in decoder.new_stream_state(1).conv} == {torch.float32}


def test_half_convolutions_are_refused_for_a_bf16_decoder(small_config: CodecDecoderConfig) -> None:
    decoder = random_decoder(small_config).to(torch.bfloat16)
    with pytest.raises(ValueError, match="half-precision convolutions are for a float32 decoder"):
        decoder.use_half_convolutions(True)
