"""A test OTLP/gRPC endpoint: implements OpenTelemetry's TraceService and keeps every span it is sent."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class ReceivedSpan:
    span: Any  # opentelemetry.proto.trace.v1.Span
    resource: dict[str, Any]

    @property
    def name(self) -> str:
        return self.span.name

    @property
    def trace_id(self) -> str:
        return self.span.trace_id.hex()

    @property
    def span_id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent_span_id(self) -> str:
        return self.span.parent_span_id.hex()

    @property
    def attributes(self) -> dict[str, Any]:
        return attribute_values(self.span.attributes)

    @property
    def event_names(self) -> list[str]:
        return [event.name for event in self.span.events]


def attribute_values(attributes: Any) -> dict[str, Any]:
    values = {}
    for attribute in attributes:
        value = attribute.value
        values[attribute.key] = getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None
    return values


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    def Export(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self._lock:
            for resource_spans in request.resource_spans:
                resource = attribute_values(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    self._spans.extend(ReceivedSpan(span, resource) for span in scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop(grace=None)


def running_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.stop()
