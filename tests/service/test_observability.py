"""Metrics, traces and logs of a real server process, checked by the tools that consume them.

One server process on the tiny model runs with `--metrics-port`, `--log-format json` and the
standard OTEL_* variables pointing at a test OTLP/gRPC receiver. A real Prometheus (Debian's
package, downloaded and unpacked when not installed) scrapes it every second while three client
threads keep every RPC busy for a few seconds; each call runs inside a client span, so the
server's spans must join the client's traces. The tests then read what each consumer got: the
Prometheus HTTP API (series, values, every PromQL expression of the Grafana dashboard), the
receiver's spans, and the server's log lines.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from clients.qwen3_tts_client import Connection, Generation, TtsClient, Voice
from clients.qwen3_tts_client.client import synthesize_request
from tests.debian_tools import debian_program
from tests.service.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.service.processes import ServerProcess, free_port, server_process, stop

DASHBOARD = Path(__file__).resolve().parents[2] / "observability" / "grafana" / "qwen3-tts.json"
SERVICE_NAME = "qwen3-tts-observability-test"
RYAN = Voice(speaker="ryan", language="english")
GREEDY = Generation(temperature=0.0)
MAX_AUDIO_SECONDS = 0.8  # the random model never stops on its own: every call makes NUM_FRAMES frames
NUM_FRAMES = 10
TRAFFIC_SECONDS = 4.0  # several 1 s scrapes see requests running
TEXTS = {"Synthesize": "Hello there, how are you?", "SynthesizeOnline": "A streamed hello.",
         "StreamingSynthesize": "Word by word, as an LLM would send it."}
RATE_WINDOW = "2m"  # stands in for Grafana's $__rate_interval; the whole module runs inside it
PROMETHEUS_START_TIMEOUT_S = 60.0


@dataclass
class Traffic:
    """What the clients sent: how many calls of each RPC ended OK, and each traced call's client span."""

    num_ok: Counter[str] = field(default_factory=Counter)
    num_invalid: int = 0
    client_spans: dict[str, tuple[str, str]] = field(default_factory=dict)  # request id -> (trace id, span id)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Observed:
    server: ServerProcess
    receiver: OtlpReceiver
    prometheus_url: str
    traffic: Traffic


# -- the server, the receiver and Prometheus ------------------------------------------------------


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    running = OtlpReceiver()
    running.start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def observed(receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    prometheus = debian_program("prometheus", "prometheus")
    directory = tmp_path_factory.mktemp("observability")
    metrics_port = free_port()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_EXPORTER_OTLP_INSECURE": "true",
           "OTEL_SERVICE_NAME": SERVICE_NAME, "OTEL_BSP_SCHEDULE_DELAY": "200"}
    with server_process(directory, "--metrics-port", str(metrics_port), "--log-format", "json",
                        "--max-audio-seconds", str(MAX_AUDIO_SECONDS), "--drain-timeout-seconds", "5",
                        env=env) as server, \
            running_prometheus(prometheus, directory, metrics_port) as prometheus_url:
        wait_for(lambda: query(prometheus_url, "up") == [1.0], "Prometheus's first scrape of the server")
        traffic = send_traffic(server.target)
        expected = sum(traffic.num_ok.values()) + traffic.num_invalid
        wait_for(lambda: query(prometheus_url, "sum(qwen3_tts_requests_total)") == [expected],
                 f"Prometheus to count all {expected} calls")
        # rate() needs two samples of a series: the refused call's counter appeared in the last scrape.
        wait_for(lambda: query(prometheus_url, 'count_over_time(qwen3_tts_requests_total{status!="OK"}[5m])')
                 >= [2.0], "a second scrape of the refused call's counter")
        yield Observed(server, receiver, prometheus_url, traffic)


@contextlib.contextmanager
def running_prometheus(binary: Path, directory: Path, metrics_port: int) -> Iterator[str]:
    """A Prometheus scraping 127.0.0.1:`metrics_port` every second; yields its URL."""
    config = directory / "prometheus.yml"
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "qwen3-tts", "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]}],
    }))
    port = free_port()
    log = directory / "prometheus.log"
    with open(log, "wb") as log_file:
        process = subprocess.Popen(
            [str(binary), f"--config.file={config}", f"--storage.tsdb.path={directory / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=log_file, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _is_ready(url, process, log), "Prometheus to be ready", PROMETHEUS_START_TIMEOUT_S)
        yield url
    finally:
        stop(process)


def _is_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> bool:
    assert process.poll() is None, f"Prometheus exited:\n{log.read_text(errors='replace')[-3000:]}"
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


# -- traffic ------------------------------------------------------------------------------------


def send_traffic(target: str) -> Traffic:
    """Three threads, one per RPC, each calling in a loop for TRAFFIC_SECONDS, every call in a client span;
    then one call the server refuses."""
    traffic = Traffic()
    tracer = TracerProvider().get_tracer("observability-test-client")
    stop_at = time.monotonic() + TRAFFIC_SECONDS

    def call(rpc: str, client: TtsClient) -> str:
        text = TEXTS[rpc]
        if rpc == "Synthesize":
            request = synthesize_request(text, RYAN, None, GREEDY)
            _, outcome = client.stub.Synthesize.with_call(request, metadata=client.connection.metadata)
            return dict(outcome.initial_metadata())["x-request-id"]
        if rpc == "SynthesizeOnline":
            responses = client.synthesize_online(text, RYAN, generation=GREEDY)
        else:
            responses = client.streaming_synthesize(re.split(r"(?<= )", text), RYAN, generation=GREEDY)
        for _ in responses:
            pass
        return dict(responses.initial_metadata())["x-request-id"]

    def loop(rpc: str) -> None:
        with TtsClient(Connection(target=target)) as client:
            while time.monotonic() < stop_at:
                with tracer.start_as_current_span(f"client {rpc}") as span:
                    request_id = call(rpc, client)
                context = span.get_span_context()
                with traffic.lock:
                    traffic.num_ok[rpc] += 1
                    traffic.client_spans[request_id] = (trace.format_trace_id(context.trace_id),
                                                        trace.format_span_id(context.span_id))

    threads = [threading.Thread(target=loop, args=(rpc,)) for rpc in TEXTS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    with TtsClient(Connection(target=target)) as client, pytest.raises(grpc.RpcError) as refused:
        client.synthesize("Hello.", Voice(speaker="nobody"))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    traffic.num_invalid = 1
    return traffic


# -- reading Prometheus ---------------------------------------------------------------------------


def prometheus_api(url: str, path: str, **params: str) -> Any:
    with urllib.request.urlopen(f"{url}/api/v1/{path}?{urllib.parse.urlencode(params)}", timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]


def query(url: str, promql: str) -> list[float]:
    """An instant query's values, one per series."""
    return [float(series["value"][1]) for series in prometheus_api(url, "query", query=promql)["result"]]


def one(url: str, promql: str) -> float:
    values = query(url, promql)
    assert len(values) == 1, f"{promql}: {len(values)} series"
    return values[0]


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.25)


# -- metrics ------------------------------------------------------------------------------------


def test_prometheus_counts_every_call_by_rpc_and_status(observed: Observed) -> None:
    url, traffic = observed.prometheus_url, observed.traffic
    for rpc, count in traffic.num_ok.items():
        assert count >= 1
        assert one(url, f'sum(qwen3_tts_requests_total{{rpc="{rpc}", status="OK", finish_reason="length"}})') \
            == count
    assert one(url, 'sum(qwen3_tts_requests_total{status="INVALID_ARGUMENT", finish_reason=""})') == 1
    num_ok = sum(traffic.num_ok.values())
    assert one(url, "sum(qwen3_tts_time_to_first_audio_seconds_count)") == num_ok
    assert one(url, "sum(qwen3_tts_realtime_factor_count)") == num_ok
    assert one(url, "sum(qwen3_tts_frames_total)") == num_ok * NUM_FRAMES


def test_prometheus_sees_plausible_latencies_and_rates(observed: Observed) -> None:
    url = observed.prometheus_url
    median_ttfa = one(url, "histogram_quantile(0.5, sum by (le) (qwen3_tts_time_to_first_audio_seconds_bucket))")
    assert 0 < median_ttfa < 10
    assert 0 < one(url, "histogram_quantile(0.5, sum by (le) (qwen3_tts_queue_seconds_bucket))") < 10
    assert 0 < one(url, "histogram_quantile(0.5, sum by (le) (qwen3_tts_prefill_seconds_bucket))") < 10
    assert one(url, "sum(qwen3_tts_engine_step_seconds_count)") > 0
    assert one(url, "sum(qwen3_tts_audio_seconds_total)") == pytest.approx(
        sum(observed.traffic.num_ok.values()) * MAX_AUDIO_SECONDS)
    # Scraped while the clients were busy: some scrape saw requests running.
    assert one(url, "max_over_time(qwen3_tts_requests_running[5m])") >= 1


def test_prometheus_sees_the_live_gauges_back_at_zero_and_the_build(observed: Observed) -> None:
    url = observed.prometheus_url
    wait_for(lambda: query(url, "qwen3_tts_requests_running") == [0.0], "running back to 0")
    for gauge in ("qwen3_tts_requests_waiting", "qwen3_tts_requests_parked", "qwen3_tts_kv_blocks_used"):
        assert one(url, gauge) == 0, gauge
    assert one(url, "qwen3_tts_kv_blocks") > 0
    build = prometheus_api(url, "query", query="qwen3_tts_build_info")["result"]
    assert len(build) == 1
    labels = build[0]["metric"]
    assert labels["model"] == labels["model"].strip() != ""
    assert labels["device"] == "cpu" and labels["version"] and labels["mode"] == "custom_voice"
    assert query(url, 'qwen3_tts_cuda_graphs{kind="decode"}') == [0.0]  # the CPU captures none


def dashboard_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel.get("targets", [])]


@pytest.mark.parametrize(("panel", "expression"), dashboard_queries())
def test_every_dashboard_query_returns_data(observed: Observed, panel: str, expression: str) -> None:
    promql = (expression.replace("$__rate_interval", RATE_WINDOW)
              .replace('"$model"', '".*"').replace('"$instance"', '".*"'))
    assert "$" not in promql, f"{panel}: a variable the test does not know: {promql}"
    result = prometheus_api(observed.prometheus_url, "query", query=promql)["result"]
    assert result, f"{panel}: no data for {promql}"


def test_dashboard_variables_list_the_running_model_and_instance(observed: Observed) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    for name in ("model", "instance"):
        # label_values(<selector>, <label>), as Grafana's Prometheus data source resolves it.
        definition = variables[name]["query"]["query"].replace('"$model"', '".*"')
        selector, label = definition.removeprefix("label_values(").removesuffix(")").rsplit(", ", 1)
        values = prometheus_api(observed.prometheus_url, f"label/{label}/values", **{"match[]": selector})
        assert len(values) == 1, f"{name}: {values}"


# -- traces ---------------------------------------------------------------------------------------


def server_spans(observed: Observed) -> dict[str, ReceivedSpan]:
    """The server's call spans by request id, once the receiver has every traced call's span."""
    wanted = set(observed.traffic.client_spans)

    def spans_by_request() -> dict[str, ReceivedSpan]:
        return {span.attributes["qwen3_tts.request_id"]: span for span in observed.receiver.spans()
                if "qwen3_tts.request_id" in span.attributes}

    wait_for(lambda: wanted <= set(spans_by_request()), "the server spans of every traced call")
    return spans_by_request()


def test_every_call_span_joins_the_clients_trace(observed: Observed) -> None:
    spans = server_spans(observed)
    for request_id, (trace_id, client_span_id) in observed.traffic.client_spans.items():
        span = spans[request_id]
        assert span.trace_id == trace_id
        assert span.parent_span_id == client_span_id
        assert span.span.kind == span.span.SPAN_KIND_SERVER
        assert span.resource["service.name"] == SERVICE_NAME


def test_call_spans_carry_the_calls_attributes_stage_spans_and_events(observed: Observed) -> None:
    spans = server_spans(observed)
    children: dict[str, list[ReceivedSpan]] = {}
    for span in observed.receiver.spans():
        children.setdefault(span.parent_span_id, []).append(span)
    for request_id in observed.traffic.client_spans:
        span = spans[request_id]
        attributes = span.attributes
        rpc = attributes["rpc.method"]
        assert span.name == f"qwen3_tts.v1.TextToSpeech/{rpc}"
        assert attributes["rpc.system"] == "grpc" and attributes["rpc.grpc.status_code"] == 0
        assert attributes["qwen3_tts.mode"] == "custom_voice"
        assert attributes["qwen3_tts.text_length"] == len(TEXTS[rpc])
        assert attributes["qwen3_tts.frames"] == NUM_FRAMES
        assert attributes["qwen3_tts.audio_seconds"] == pytest.approx(MAX_AUDIO_SECONDS)
        assert attributes["qwen3_tts.finish_reason"] == "length"
        assert attributes["qwen3_tts.input_tokens"] > 0
        assert span.event_names == ["first_audio", "finished"]
        stages = {child.name: child.span for child in children.get(span.span_id, [])}
        assert set(stages) == {"queued", "prefill", "decode"}
        assert stages["queued"].end_time_unix_nano <= stages["prefill"].start_time_unix_nano + 1
        assert stages["prefill"].end_time_unix_nano <= stages["decode"].start_time_unix_nano + 1
        assert span.span.start_time_unix_nano <= stages["queued"].start_time_unix_nano
        assert stages["decode"].end_time_unix_nano <= span.span.end_time_unix_nano


def test_a_refused_call_is_traced_with_its_status_and_no_engine_stages(observed: Observed) -> None:
    wait_for(lambda: any(span.attributes.get("rpc.grpc.status_code") == grpc.StatusCode.INVALID_ARGUMENT.value[0]
                         for span in observed.receiver.spans()), "the refused call's span")
    refused = [span for span in observed.receiver.spans()
               if span.attributes.get("rpc.grpc.status_code") == grpc.StatusCode.INVALID_ARGUMENT.value[0]]
    assert len(refused) == 1
    span = refused[0]
    assert span.name == "qwen3_tts.v1.TextToSpeech/Synthesize"
    assert "qwen3_tts.frames" not in span.attributes
    # The caller's mistake, not the server's: the span's status stays unset.
    assert span.span.status.code == span.span.status.STATUS_CODE_UNSET
    assert not [child for child in observed.receiver.spans() if child.parent_span_id == span.span_id]


def test_health_checks_are_not_traced(observed: Observed) -> None:
    server_spans(observed)  # every call has been exported, and the health checks came before them
    assert all(span.name.startswith("qwen3_tts.v1.TextToSpeech/") or span.parent_span_id
               for span in observed.receiver.spans())
    assert not [span for span in observed.receiver.spans() if "Health" in span.name]


# -- logs -----------------------------------------------------------------------------------------


def test_logs_are_json_lines_tagged_with_the_calls_request_and_trace_ids(observed: Observed) -> None:
    spans = server_spans(observed)
    records = [json.loads(line) for line in observed.server.log_text().splitlines() if line.startswith("{")]
    assert records and all({"time", "level", "logger", "message"} <= record.keys() for record in records)
    finished = {record["request_id"]: record for record in records
                if "request_id" in record and record["message"].startswith("length after")}
    for request_id in observed.traffic.client_spans:
        assert finished[request_id]["trace_id"] == spans[request_id].trace_id
    refused = [record for record in records if record["message"].startswith("answered INVALID_ARGUMENT")]
    assert len(refused) == 1 and "voice.speaker" in refused[0]["message"]
    refused_span = spans[refused[0]["request_id"]]
    assert refused[0]["trace_id"] == refused_span.trace_id
