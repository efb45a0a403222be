"""OpenTelemetry traces: one server span per speech call, exported over OTLP/gRPC.

The SDK configures itself from the standard OTEL_* environment variables (endpoint, headers,
certificates, service name, resource attributes, sampler, propagators); the server's config only
decides whether tracing is on at all, which it is when an OTLP endpoint is set. When it is off no
tracer exists and calls pay nothing.

A call's span starts when the call does, as a child of the client's `traceparent` metadata when
there is one. The stages inside the engine (queued, prefill, decode) become child spans at the
call's end, from the timeline the engine recorded, so the engine's loop does no tracing work.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import grpc
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from observability.calls import CallRecord
from qwen3_tts.v1.protocol import SERVICE_NAME as GRPC_SERVICE

DEFAULT_SERVICE_NAME = "qwen3-tts"
ATTRIBUTE_PREFIX = "qwen3_tts."
# The server's own faults; the others (bad input, cancels, the client's deadline) are the caller's.
_SERVER_ERROR_STATUSES = frozenset({"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE",
                                    "DATA_LOSS"})


def service_resource(version: str) -> Resource:
    """OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win; the service is named qwen3-tts otherwise."""
    resource = Resource.create({SERVICE_VERSION: version})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource


def otlp_provider(version: str) -> TracerProvider:
    """Spans batched to the OTLP/gRPC endpoint in OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return provider_with(service_resource(version), BatchSpanProcessor(OTLPSpanExporter()))


def provider_with(resource: Resource, processor: SpanProcessor) -> TracerProvider:
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(processor)
    return provider


class CallTracer:
    """Starts and ends the spans of speech calls for one model."""

    def __init__(self, provider: TracerProvider, model: str, mode: str) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer("qwen3_tts.server")
        self._model_attributes = {ATTRIBUTE_PREFIX + "model": model, ATTRIBUTE_PREFIX + "mode": mode}

    def start(self, record: CallRecord, metadata: Iterable[tuple[str, str | bytes]]) -> Span:
        """The call's server span, a child of the caller's trace context if its metadata carries one."""
        carrier = {key: value for key, value in metadata if isinstance(value, str)}
        attributes: dict[str, str] = {ATTRIBUTE_PREFIX + "request_id": record.request_id, **self._model_attributes}
        if record.http_route is None:
            name = f"{GRPC_SERVICE}/{record.rpc}"
            attributes |= {"rpc.system": "grpc", "rpc.service": GRPC_SERVICE, "rpc.method": record.rpc}
        else:  # OpenTelemetry's HTTP server conventions: the span is named by method and route
            name = record.http_route
            method, _, route = record.http_route.partition(" ")
            attributes |= {"http.request.method": method, "http.route": route, ATTRIBUTE_PREFIX + "rpc": record.rpc}
        return self._tracer.start_span(name, context=propagate.extract(carrier), kind=SpanKind.SERVER,
                                       attributes=attributes)

    def end(self, span: Span, record: CallRecord, status: str) -> None:
        """Attributes, stage spans and events from the finished call's record; then the span ends."""
        to_epoch_ns = _epoch_converter()
        code = grpc.StatusCode[status] if status in grpc.StatusCode.__members__ else grpc.StatusCode.UNKNOWN
        # An HTTP call's status is said in gRPC's words too (the metrics' `status` label), under the service's own
        # attribute: rpc.grpc.status_code belongs to gRPC spans.
        outcome = ({"rpc.grpc.status_code": code.value[0]} if record.http_route is None
                   else {ATTRIBUTE_PREFIX + "status": code.name})
        span.set_attributes({**outcome, ATTRIBUTE_PREFIX + "text_length": record.num_text_chars})
        finish_reason = record.finish_reason(status)
        if finish_reason:
            span.set_attribute(ATTRIBUTE_PREFIX + "finish_reason", finish_reason)
        context = trace.set_span_in_context(span)
        if record.voice_clone is not None:
            self._stage("voice_clone", context, to_epoch_ns(record.voice_clone[0]), to_epoch_ns(record.voice_clone[1]))
        result = record.result
        if result is not None:
            span.set_attributes({ATTRIBUTE_PREFIX + "frames": result.num_frames,
                                 ATTRIBUTE_PREFIX + "input_tokens": result.num_input_tokens,
                                 ATTRIBUTE_PREFIX + "audio_seconds": result.audio_s})
            if result.segment_retries:
                span.set_attribute(ATTRIBUTE_PREFIX + "segment_retries", list(result.segment_retries))
            timeline = result.timeline
            stages = (("queued", timeline.arrival, timeline.admitted or timeline.finished),
                      ("prefill", timeline.admitted, timeline.first_frame),
                      ("decode", timeline.first_frame, timeline.finished))
            for name, start, end in stages:
                if start is not None and end is not None:
                    self._stage(name, context, to_epoch_ns(start), to_epoch_ns(end))
            if timeline.first_audio is not None:
                span.add_event("first_audio", timestamp=to_epoch_ns(timeline.first_audio))
            span.add_event("finished", {ATTRIBUTE_PREFIX + "finish_reason": result.finish_reason},
                           timestamp=to_epoch_ns(timeline.finished))
        if status in _SERVER_ERROR_STATUSES:
            span.set_status(Status(StatusCode.ERROR, status))
        span.end()

    def _stage(self, name: str, context: Context, start_ns: int, end_ns: int) -> None:
        self._tracer.start_span(name, context=context, start_time=start_ns).end(end_time=end_ns)

    def shutdown(self) -> None:
        """Export what is batched, then stop."""
        self.provider.shutdown()


def _epoch_converter() -> Callable[[float], int]:
    """time.monotonic() readings -> Unix nanoseconds, as OpenTelemetry stamps spans."""
    offset_ns = time.time_ns() - time.monotonic_ns()
    return lambda monotonic_s: offset_ns + round(monotonic_s * 1e9)


def trace_id_of(span: Span) -> str:
    """The span's trace id as 32 hex digits, as logs and other tools print it."""
    return trace.format_trace_id(span.get_span_context().trace_id)
