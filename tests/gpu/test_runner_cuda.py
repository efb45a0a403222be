"""On a GPU: the graph-captured runner produces the eager path's frames (fp32, tiny model)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
import torch

from benchmarks.frame_step import device_step_seconds, time_steps
from tests.runner.test_runner import BLOCK_SIZE, assert_audio_in_flight_equals_one_shot, requests_for, run_staggered
from tts_service.eager.generate import generate_codes
from tts_service.engine.config import EngineConfig
from tts_service.model.checkpoint import LoadOptions
from tts_service.model.loading import load_model
from tts_service.runner.runner import AudioRestart, ModelRunner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_graph_captured_runner_equals_eager_generate_on_gpu() -> None:
    model = load_model("random:tiny-custom_voice", LoadOptions(device=torch.device("cuda"), dtype=torch.float32))
    requests = requests_for(model, [9, 14, 11])
    expected = generate_codes(model.talker, requests, model.config.tts_pad_token_id)
    config = EngineConfig(max_running=4, block_size=BLOCK_SIZE, num_kv_blocks=64, max_positions_per_request=256,
                          graph_batch_sizes=(1, 2))
    runner = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
    assert runner.uses_graphs
    frames = run_staggered(runner, requests, [0, 3, 5], model.config.tts_pad_token_id)
    for got, want in zip(frames, expected, strict=True):
        assert torch.equal(torch.from_numpy(np.stack(got)), want.codes)


@pytest.mark.usefixtures("fp32_convolutions")
@pytest.mark.parametrize("is_audio_in_step", [False, True], ids=["after-the-frames", "in-the-frame-step"])
def test_audio_left_in_flight_while_the_next_frames_run_equals_the_stream_decoded_at_once_on_gpu(
        is_audio_in_step: bool) -> None:
    """As the engine runs them: each step's codec graph is queued on the codec's stream, once its frames are back
    or by the frame step itself (reading the frame rows on the device), and collected only after the next step's
    frames are queued beside it. A graph buffer read after its next replay, frame rows overwritten before the
    codec read them, or a codec state stored out of order, would be off by far more than 1e-4 (chunked and whole
    agree to ~1e-6 in exact fp32)."""
    model = load_model("random:tiny-custom_voice", LoadOptions(device=torch.device("cuda"), dtype=torch.float32))
    config = EngineConfig(max_running=4, block_size=BLOCK_SIZE, num_kv_blocks=64, max_positions_per_request=256,
                          graph_batch_sizes=(1, 2), codec_chunk_schedule=(1,))
    runner = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
    assert (4, 1) in runner.codec.graphs
    assert_audio_in_flight_equals_one_shot(model, runner, atol=1e-4, is_audio_in_step=is_audio_in_step)


def _refusing_host_syncs(method: Callable[..., object]) -> Callable[..., object]:
    def queue_only(*args: object, **kwargs: object) -> object:
        torch.cuda.set_sync_debug_mode("error")
        try:
            return method(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return queue_only


def refuse_host_syncs(runner: ModelRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("reset_audio", "prime_audio", "start_step", "start_audio"):
        monkeypatch.setattr(runner, name, _refusing_host_syncs(getattr(runner, name)))


@pytest.mark.parametrize("is_audio_in_step", [False, True], ids=["after-the-frames", "in-the-frame-step"])
def test_queueing_steps_restarts_and_audio_never_waits_for_the_device(
        monkeypatch: pytest.MonkeyPatch, is_audio_in_step: bool) -> None:
    """The engine queues a step's restarts and frames while the previous step's codec call runs. A copy that
    synchronizes a stream there (a blocking upload on the codec's stream, say) holds the host until that call is
    done, and the frames never run beside the codec. PyTorch's sync debug mode raises on every such call."""
    model = load_model("random:tiny-custom_voice", LoadOptions(device=torch.device("cuda"), dtype=torch.float32))
    config = EngineConfig(max_running=4, block_size=BLOCK_SIZE, num_kv_blocks=64, max_positions_per_request=256,
                          graph_batch_sizes=(1, 2), codec_chunk_schedule=(1,))
    runner = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
    refuse_host_syncs(runner, monkeypatch)
    audio: list[list[np.ndarray]] = [[], [], []]
    frames = run_staggered(runner, requests_for(model, [9, 14, 11]), [0, 3, 5], model.config.tts_pad_token_id,
                           audio, is_audio_in_step)
    assert [len(chunks) for chunks in audio] == [len(stream) for stream in frames]
    assert runner.num_eager_prefills == 0


def test_eager_prefills_and_an_eagerly_primed_codec_context_never_wait_for_the_device(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The paths without graphs: prompts longer than every captured prefill length, and a codec context (a
    clone's reference frames, a resumed stream's audio) of a length no codec graph was captured for."""
    model = load_model("random:tiny-custom_voice", LoadOptions(device=torch.device("cuda"), dtype=torch.float32))
    config = EngineConfig(max_running=4, block_size=BLOCK_SIZE, num_kv_blocks=64, max_positions_per_request=256,
                          graph_batch_sizes=(1, 2), codec_chunk_schedule=(1,), prefill_graph_lengths=(8,))
    runner = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
    refuse_host_syncs(runner, monkeypatch)
    audio: list[list[np.ndarray]] = [[], [], []]
    run_staggered(runner, requests_for(model, [4, 5, 3]), [0, 1, 1], model.config.tts_pad_token_id, audio)
    assert runner.num_eager_prefills == 2
    context = torch.randint(0, 2048, (1, 3, 16), generator=torch.Generator().manual_seed(2)).numpy()
    assert not any(num_frames == 3 for _, num_frames in runner.codec.graphs)
    runner.reset_audio([3])
    runner.prime_audio([3], context)
    torch.cuda.synchronize()


def test_codec_graphs_run_on_their_own_stream_and_memory_pool_beside_the_frame_graphs() -> None:
    """The codec's graphs replay while the frame graphs run: sharing a memory pool (or the capture stream's cuBLAS
    workspace), they would overwrite each other's intermediates."""
    model = load_model("random:tiny-custom_voice", LoadOptions(device=torch.device("cuda"), dtype=torch.float32))
    config = EngineConfig(max_running=4, block_size=BLOCK_SIZE, num_kv_blocks=8, max_positions_per_request=32,
                          graph_batch_sizes=(1, 2), codec_chunk_schedule=(1, 2))
    runner = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
    frame_graphs = [*runner.rows.talker_graphs.values(), *runner.rows.sampling_graphs.values(),
                    *runner.prefill.graphs.values()]
    codec_pools = {graph.pool() for graph in runner.codec.graphs.values()}
    assert len(codec_pools) == 1 and frame_graphs and runner.codec.graphs
    assert not codec_pools & {graph.pool() for graph in frame_graphs}
    assert runner.codec_stream is not None and runner.codec_stream != torch.cuda.current_stream()


@pytest.mark.usefixtures("fp32_convolutions")
@pytest.mark.parametrize("is_half", [False, True], ids=["fp32", "fp16-convolutions"])
def test_graph_captured_codec_chunks_equal_eager_chunks_on_gpu(is_half: bool) -> None:
    """Same chunking both ways; the captured graphs pad 3 rows to their 4-row bucket, and the padding row must
    change nothing (the one-shot comparison is the CPU test's job). With fp16 convolutions the graphs' autotuned
    kernels sum in other orders than the eager ones, which tips some fp16 roundings the other way."""
    options = LoadOptions(device=torch.device("cuda"), dtype=torch.float32, codec_half_convolutions=is_half)
    model = load_model("random:tiny-custom_voice", options)
    config = EngineConfig(max_running=4, block_size=BLOCK_SIZE, num_kv_blocks=8, max_positions_per_request=32,
                          graph_batch_sizes=(1, 2), codec_chunk_schedule=(1, 2, 4))
    frame_rate_hz = model.speech_config.frame_rate_hz
    graphed = ModelRunner(model, config.runner_config(frame_rate_hz))
    eager = ModelRunner(model, replace(config, use_cuda_graphs=False).runner_config(frame_rate_hz))
    assert (2, 4) in graphed.codec.graphs and (4, 4) in graphed.codec.graphs and not eager.codec.graphs
    assert not torch.backends.cudnn.benchmark, "cuDNN autotunes only while the codec's graphs are captured"
    generator = torch.Generator().manual_seed(5)
    codes = torch.randint(0, 2048, (3, 10, 16), generator=generator).numpy()
    slots = [3, 0, 2]
    streams = []
    for runner in (graphed, eager):
        runner.reset_audio(slots)
        # 1, 2 and 4 frames replay graphs (3 rows pad to the 4-row bucket); the 3-frame tail runs eagerly.
        streams.append(np.concatenate([runner.decode_audio(slots, codes[:, start:end])
                                       for start, end in ((0, 1), (1, 3), (3, 7), (7, 10))], axis=1))
    difference = np.abs(streams[0] - streams[1]).max()
    if not is_half:
        assert difference <= 1e-5, f"graph and eager audio differ by {difference}"
        return
    error_power = np.sum((streams[0] - streams[1]).astype(np.float64) ** 2)
    error_db = np.inf if error_power == 0 else 10 * np.log10(np.sum(streams[1].astype(np.float64) ** 2) / error_power)
    assert error_db > 45, f"graph and eager audio differ by {difference} ({error_db:.1f} dB)"


def test_a_burst_of_prefills_beyond_the_largest_prefill_graph_replays_graphs_in_groups_and_equals_eager() -> None:
    model = load_model("random:tiny-custom_voice", LoadOptions(device=torch.device("cuda"), dtype=torch.float32))
    requests = requests_for(model, [9, 14, 11])
    expected = generate_codes(model.talker, requests, model.config.tts_pad_token_id)
    config = EngineConfig(max_running=4, block_size=BLOCK_SIZE, num_kv_blocks=64, max_positions_per_request=256,
                          graph_batch_sizes=(1, 2, 4), prefill_graph_batch_sizes=(1, 2))
    runner = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
    frames = run_staggered(runner, requests, [0, 0, 0], model.config.tts_pad_token_id)  # 3 prefills: 2 + 1
    assert runner.num_eager_prefills == 0
    for got, want in zip(frames, expected, strict=True):
        assert torch.equal(torch.from_numpy(np.stack(got)), want.codes)


def test_the_frame_step_benchmark_times_captured_steps_of_every_row() -> None:
    model = load_model("random:tiny-custom_voice", LoadOptions(device=torch.device("cuda"), dtype=torch.bfloat16))
    config = EngineConfig(max_running=4, block_size=BLOCK_SIZE, num_kv_blocks=64, max_positions_per_request=64,
                          graph_batch_sizes=(1, 2))
    runner = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
    times = time_steps(runner, batch=3, context=8, iterations=2)
    assert len(times) == 2 and all(seconds > 0 for seconds in times)
    assert torch.equal(runner.state.seeds[:3].cpu(), torch.arange(3))
    assert 0 < device_step_seconds(runner, batch=3, frames=2) < 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_rope_rows_the_runner_gathers_are_the_computed_cos_and_sin_bit_for_bit_on_gpu(dtype: torch.dtype) -> None:
    """The runner's talker gathers its steps' cos and sin from rows made once: they must be what it would compute."""
    talker = load_model("random:tiny-custom_voice", LoadOptions(device=torch.device("cuda"), dtype=dtype)).talker
    assert talker.config.mrope_interleaved
    positions = torch.randint(0, 4096, (3, 5), generator=torch.Generator().manual_seed(0)).cuda()
    for rows, values in zip(talker.rope_rows(4096, dtype), talker.rope_cos_sin(positions, dtype), strict=True):
        assert torch.equal(rows[positions], values)


def test_a_kept_voice_state_starts_a_second_stream_as_a_fresh_decode_would_without_waiting_for_the_device(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A clone's reference frames decoded once, on the codec's stream, their state kept and copied into the next
    stream in that voice there: the same state and audio as decoding them again, and no host sync on the way."""
    model = load_model("random:tiny-base", LoadOptions(device=torch.device("cuda"), dtype=torch.float32))
    config = EngineConfig(max_running=4, block_size=BLOCK_SIZE, num_kv_blocks=64, max_positions_per_request=256,
                          graph_batch_sizes=(1, 2), codec_chunk_schedule=(1,))
    runner = ModelRunner(model, config.runner_config(model.speech_config.frame_rate_hz))
    fresh = ModelRunner(model, replace(config, max_primed_voices=0).runner_config(model.speech_config.frame_rate_hz))
    reference = torch.randint(0, 2048, (7, runner.num_groups), generator=torch.Generator().manual_seed(4)).numpy()
    # The whole restart under sync checks (the other methods' wrappers would switch them off on their way out).
    monkeypatch.setattr(runner, "_restart_audio", _refusing_host_syncs(runner._restart_audio))
    with torch.inference_mode():
        runner._restart_audio((AudioRestart(0, reference, is_voice_reference=True),))
        runner._restart_audio((AudioRestart(1, reference, is_voice_reference=True),))
        fresh._restart_audio((AudioRestart(0, reference, is_voice_reference=True),))
    monkeypatch.undo()
    torch.cuda.synchronize()
    assert runner.primed_voices.num_hits == 1
    rows = [state.select_rows(torch.tensor([slot], device="cuda")).tensors()
            for state, slot in ((runner.codec_state, 0), (runner.codec_state, 1), (fresh.codec_state, 0))]
    for kept, started, decoded in zip(*rows, strict=True):
        assert torch.equal(started, kept) and torch.equal(started, decoded)
    frames = torch.randint(0, 2048, (1, 1, runner.num_groups), generator=torch.Generator().manual_seed(5)).numpy()
    assert np.array_equal(runner.decode_audio([1], frames), fresh.decode_audio([0], frames))
