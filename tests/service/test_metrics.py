"""Prometheus metrics of a real server on the tiny model: what a scrape shows after known traffic, and the
HTTP endpoint that serves them."""

from __future__ import annotations

import socket
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from clients.qwen3_tts_client import Voice
from observability.calls import CallRecord, CallResult, RequestTimeline
from observability.metrics import LiveState, ServiceMetrics
from tests.service.helpers import GREEDY, RYAN, RunningServer, start_server, wait_until
from tests.service.processes import free_port
from tests.service.test_voice_clone import REFERENCE_TEXT, pcm16_samples, wav_file
from tests.test_playback import chunks_with_one_late
from tts_service.model.checkpoint import LoadedModel

NUM_IDLE_CONNECTIONS = 200


@pytest.fixture(scope="module")
def metered(tiny_models: dict[str, LoadedModel]) -> Iterator[tuple[RunningServer, ServiceMetrics]]:
    metrics = ServiceMetrics("tiny", "custom_voice")
    running = start_server(tiny_models["custom_voice"], with_engine=False, metrics_port=free_port())
    running.attach_engine(metrics)
    yield running, metrics
    running.stop()


def metrics_address(running: RunningServer) -> tuple[str, int]:
    port = running.server.config.metrics_port
    assert port is not None
    return "127.0.0.1", port


def scrape(running: RunningServer) -> str:
    """The server's /metrics page, fetched over HTTP on a new connection."""
    host, port = metrics_address(running)
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def samples(metrics: ServiceMetrics, text: str | None = None) -> dict[tuple[str, frozenset], float]:
    """Every sample of a scrape as {(name, labels): value}."""
    if text is None:
        from prometheus_client import generate_latest

        text = generate_latest(metrics.registry).decode()
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(scrape: dict, name: str, **labels: str) -> float:
    wanted = {"model": "tiny", "mode": "custom_voice", **labels}
    matches = [v for (n, found), v in scrape.items() if n == name and wanted.items() <= dict(found).items()]
    assert len(matches) == 1, f"{name} {labels}: {len(matches)} series"
    return matches[0]


def test_a_scrape_counts_every_call_by_rpc_status_and_finish_reason(metered: tuple[RunningServer,
                                                                                  ServiceMetrics]) -> None:
    running, metrics = metered
    with running.client() as client:
        client.synthesize("Hello there.", RYAN, generation=GREEDY)
        list(client.synthesize_online("Hello again.", RYAN, generation=GREEDY))
        list(client.streaming_synthesize(["Hel", "lo, ", "world."], RYAN, generation=GREEDY))
        with pytest.raises(grpc.RpcError):
            client.synthesize("Hello.", RYAN.__class__(speaker="nobody"))
    # A call is recorded as its handler ends, which can be just after the client has its answer.
    assert wait_until(lambda: sum(v for (name, _), v in samples(metrics).items()
                                  if name == "qwen3_tts_requests_total") == 4)
    scrape = samples(metrics)
    for rpc in ("Synthesize", "SynthesizeOnline", "StreamingSynthesize"):
        assert value(scrape, "qwen3_tts_requests_total", rpc=rpc, status="OK", finish_reason="length") == 1
    assert value(scrape, "qwen3_tts_requests_total", rpc="Synthesize", status="INVALID_ARGUMENT",
                 finish_reason="") == 1
    assert value(scrape, "qwen3_tts_time_to_first_audio_seconds_count") == 3
    assert value(scrape, "qwen3_tts_time_to_first_audio_seconds_sum") > 0
    assert value(scrape, "qwen3_tts_realtime_factor_count") == 3
    assert value(scrape, "qwen3_tts_audio_seconds_total") > 0
    assert value(scrape, "qwen3_tts_frames_total") == value(scrape, "qwen3_tts_audio_seconds_total") * 12.5
    # The two streamed calls sent chunks, so their underruns and chunk gaps were measured, and their first
    # audio's way outside the engine.
    assert value(scrape, "qwen3_tts_underrun_seconds_count") == 2
    for phase in ("to_engine", "from_engine", "to_grpc"):
        assert value(scrape, "qwen3_tts_first_audio_path_seconds_count", phase=phase) == 2
    assert value(scrape, "qwen3_tts_engine_step_seconds_count") > 0
    assert value(scrape, "qwen3_tts_engine_batch_size_count") > 0


def test_a_streamed_calls_first_audio_path_is_observed_from_the_server_and_engine_timestamps() -> None:
    metrics = ServiceMetrics("tiny", "custom_voice")
    record = CallRecord("SynthesizeOnline", "path", started=100.0)
    record.first_audio_received = 100.0155
    record.add_chunk(0.0, sent_at_s=100.018)
    timeline = RequestTimeline(arrival=100.002, admitted=100.004, first_frame=100.012, first_audio=100.015,
                               finished=101.0)
    record.result = CallResult("length", timeline, num_frames=10, num_input_tokens=5, audio_s=0.8)
    metrics.observe_call(record, "OK")
    scrape = samples(metrics)
    for phase, seconds in (("to_engine", 0.002), ("from_engine", 0.0005), ("to_grpc", 0.0025)):
        assert value(scrape, "qwen3_tts_first_audio_path_seconds_count", phase=phase) == 1
        assert value(scrape, "qwen3_tts_first_audio_path_seconds_sum", phase=phase) == pytest.approx(seconds)
    assert value(scrape, "qwen3_tts_time_to_first_audio_seconds_sum") == pytest.approx(0.013)


def test_a_long_texts_segment_retries_are_counted_by_reason() -> None:
    metrics = ServiceMetrics("tiny", "custom_voice")
    record = CallRecord("Synthesize", "long", started=100.0)
    timeline = RequestTimeline(arrival=100.0, admitted=100.0, first_frame=100.01, first_audio=100.02, finished=110.0)
    record.result = CallResult("stopped", timeline, num_frames=900, num_input_tokens=700, audio_s=72.0,
                               segment_retries=("early_end", "runaway", "early_end"))
    metrics.observe_call(record, "OK")
    scrape = samples(metrics)
    assert value(scrape, "qwen3_tts_segment_retries_total", reason="early_end") == 2
    assert value(scrape, "qwen3_tts_segment_retries_total", reason="runaway") == 1


def test_a_calls_underrun_is_the_time_its_listener_was_starved_each_stall_once() -> None:
    metrics = ServiceMetrics("tiny", "custom_voice")
    record = CallRecord("SynthesizeOnline", "one-stall", started=100.0)
    for chunk in chunks_with_one_late(0.5):  # the chunks behind the late one each add nothing
        record.add_chunk(chunk.offset_s, sent_at_s=chunk.arrival_s)
    assert record.underrun_s() == pytest.approx(0.5)
    metrics.observe_call(record, "OK")
    scrape = samples(metrics)
    assert value(scrape, "qwen3_tts_underrun_seconds_count") == 1
    assert value(scrape, "qwen3_tts_underrun_seconds_sum") == pytest.approx(0.5)


def test_live_gauges_read_the_scheduler_and_return_to_zero(metered: tuple[RunningServer, ServiceMetrics]) -> None:
    running, metrics = metered
    with running.client() as client:
        client.synthesize("Hello there.", RYAN, generation=GREEDY)
    assert wait_until(lambda: running.engine.num_live_requests == 0)
    scrape = samples(metrics)
    assert value(scrape, "qwen3_tts_requests_running") == 0
    assert value(scrape, "qwen3_tts_requests_waiting") == 0
    assert value(scrape, "qwen3_tts_requests_parked") == 0
    assert value(scrape, "qwen3_tts_kv_blocks_used") == 0
    assert value(scrape, "qwen3_tts_kv_blocks") == running.engine.scheduler.num_kv_blocks_total > 0
    assert value(scrape, "qwen3_tts_preemptions_total") == running.engine.scheduler.num_preemptions_total


def test_preemptions_are_a_counter_read_from_the_engine_when_scraped() -> None:
    metrics = ServiceMetrics("tiny", "custom_voice")
    preemptions = [3]
    metrics.watch(LiveState(num_running=lambda: 0, num_waiting=lambda: 0, num_parked=lambda: 0,
                            num_preemptions_total=lambda: preemptions[0], num_kv_blocks_used=lambda: 0,
                            num_kv_blocks_total=lambda: 0, num_cores_running=lambda: 1))
    assert value(samples(metrics), "qwen3_tts_preemptions_total") == 3
    preemptions[0] = 5
    assert value(samples(metrics), "qwen3_tts_preemptions_total") == 5


def test_the_servers_metrics_port_serves_its_metrics_over_http(metered: tuple[RunningServer, ServiceMetrics]) -> None:
    running, metrics = metered
    assert value(samples(metrics, scrape(running)), "qwen3_tts_kv_blocks") > 0


def test_idle_connections_to_the_metrics_port_start_no_threads(metered: tuple[RunningServer, ServiceMetrics]) -> None:
    running, metrics = metered
    scrape(running)  # anything the first scrape starts lazily is running before the count
    num_threads = threading.active_count()
    connections = [socket.create_connection(metrics_address(running), timeout=10)
                   for _ in range(NUM_IDLE_CONNECTIONS)]
    try:
        # Accepted after every idle connection before it: by its answer, the server has accepted them all.
        assert value(samples(metrics, scrape(running)), "qwen3_tts_kv_blocks") > 0
        assert threading.active_count() == num_threads
    finally:
        for connection in connections:
            connection.close()


def test_the_metrics_port_answers_503_until_the_model_is_loaded_and_closes_at_shutdown(
        tiny_models: dict[str, LoadedModel]) -> None:
    running = start_server(tiny_models["custom_voice"], with_engine=False, metrics_port=free_port())
    try:
        with pytest.raises(urllib.error.HTTPError) as caught:
            scrape(running)
        assert caught.value.code == 503
        running.attach_engine(ServiceMetrics("tiny", "custom_voice"))
        assert "qwen3_tts_kv_blocks" in scrape(running)
    finally:
        running.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(metrics_address(running), timeout=10)


def requests_by_status_and_finish_reason(metrics: ServiceMetrics) -> Counter[tuple[str, str]]:
    counts: Counter[tuple[str, str]] = Counter()
    for (name, labels), count in samples(metrics).items():
        if name == "qwen3_tts_requests_total":
            found = dict(labels)
            counts[found["status"], found["finish_reason"]] += int(count)
    return counts


def test_calls_ended_by_their_deadline_or_a_cancel_count_as_such_with_their_requests_aborted(
        metered: tuple[RunningServer, ServiceMetrics]) -> None:
    running, metrics = metered
    before = requests_by_status_and_finish_reason(metrics)
    with running.client() as client:
        # Six frames take several times 50 ms on the CPU: the deadline passes while the call decodes.
        with pytest.raises(grpc.RpcError) as caught:
            client.synthesize("Hello there.", RYAN, generation=GREEDY, timeout=0.05)
        assert caught.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        responses = client.synthesize_online("Hello again.", RYAN, generation=GREEDY)
        next(responses)
        responses.cancel()
    expected = {("DEADLINE_EXCEEDED", "aborted"): 1, ("CANCELLED", "aborted"): 1}
    assert wait_until(lambda: requests_by_status_and_finish_reason(metrics) - before == expected)


def test_a_call_whose_request_failed_in_the_engine_counts_as_internal_with_finish_reason_error(
        metered: tuple[RunningServer, ServiceMetrics], monkeypatch: pytest.MonkeyPatch) -> None:
    running, metrics = metered
    before = requests_by_status_and_finish_reason(metrics)

    def fail(step: Any) -> Any:
        raise RuntimeError("injected fault")

    monkeypatch.setattr(running.engine.runner, "start_step", fail)
    with running.client() as client, pytest.raises(grpc.RpcError) as caught:
        client.synthesize("Hello there.", RYAN, generation=GREEDY)
    assert caught.value.code() is grpc.StatusCode.INTERNAL
    assert wait_until(lambda: requests_by_status_and_finish_reason(metrics) - before == {("INTERNAL", "error"): 1})


def test_prefills_run_outside_the_captured_graphs_are_counted_once_each_in_the_next_step(
        metered: tuple[RunningServer, ServiceMetrics]) -> None:
    running, metrics = metered
    engine = running.engine
    before = sum(v for (name, _), v in samples(metrics).items() if name == "qwen3_tts_engine_eager_prefills_total")
    stats_before = engine.stats.num_eager_prefills

    async def as_if_two_ran_eagerly() -> None:  # on the CPU nothing is captured, so nothing runs "eagerly"
        engine.runner.num_eager_prefills += 2

    running.run(as_if_two_ran_eagerly())
    with running.client() as client:
        client.synthesize("Count me.", RYAN, generation=GREEDY)
    assert value(samples(metrics), "qwen3_tts_engine_eager_prefills_total") == before + 2
    assert engine.stats.num_eager_prefills == stats_before + 2


def test_streams_in_a_clone_voice_are_counted_by_how_they_started(tiny_models: dict[str, LoadedModel]) -> None:
    """The first stream in an in-context voice decodes its reference frames; the next starts from the state they
    left (--max-primed-voices)."""
    metrics = ServiceMetrics("tiny", "voice_clone")
    running = start_server(tiny_models["base"], with_engine=False)
    running.attach_engine(metrics)
    voice = Voice(reference_audio=wav_file(pcm16_samples(seed=0)), reference_text=REFERENCE_TEXT)
    try:
        with running.client() as client:
            for _ in range(2):
                client.synthesize("Cloned speech.", voice, generation=GREEDY)
        engine = running.engine
        assert engine.stats.num_references_decoded == 1 and engine.stats.num_references_kept == 1
        scrape = samples(metrics)
        for reference in ("decoded", "kept"):
            assert value(scrape, "qwen3_tts_engine_voice_reference_starts_total", mode="voice_clone",
                         reference=reference) == 1
    finally:
        running.stop()
