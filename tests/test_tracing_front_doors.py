"""Call spans follow OpenTelemetry's conventions for the door a call came through: gRPC's rpc.* for gRPC calls,
HTTP's method and route for the OpenAI-compatible API, the service's own attributes on both."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from observability.calls import CallRecord
from observability.tracing import CallTracer


def finished_span(record: CallRecord, status: str) -> dict[str, object]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = CallTracer(provider, "random:tiny-custom_voice", "custom_voice")
    tracer.end(tracer.start(record, ()), record, status)
    (span,) = exporter.get_finished_spans()
    return {"name": span.name, **dict(span.attributes or {})}


def test_a_grpc_call_span_is_named_and_attributed_as_grpc() -> None:
    span = finished_span(CallRecord("Synthesize", "r1"), "INVALID_ARGUMENT")
    assert span["name"] == "qwen3_tts.v1.TextToSpeech/Synthesize"
    assert (span["rpc.system"], span["rpc.method"], span["rpc.grpc.status_code"]) == ("grpc", "Synthesize", 3)
    assert span["qwen3_tts.request_id"] == "r1" and "http.route" not in span


def test_an_http_call_span_is_named_by_method_and_route_with_no_grpc_attributes() -> None:
    span = finished_span(CallRecord("OpenAISpeech", "r2", "POST /v1/audio/speech"), "RESOURCE_EXHAUSTED")
    assert span["name"] == "POST /v1/audio/speech"
    assert (span["http.request.method"], span["http.route"]) == ("POST", "/v1/audio/speech")
    assert (span["qwen3_tts.rpc"], span["qwen3_tts.status"]) == ("OpenAISpeech", "RESOURCE_EXHAUSTED")
    assert not any(name.startswith("rpc.") for name in span)
    assert span["qwen3_tts.request_id"] == "r2"
