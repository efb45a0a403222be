"""Whether the server's two listeners can bind the host a deployment configures, called as the server calls them."""

from __future__ import annotations

import socket
from concurrent import futures

import grpc
import pytest
from prometheus_client import CollectorRegistry, start_http_server

from tts_service.api.config import ServerConfig


def check_bindable(config: ServerConfig) -> None:
    """gRPC (`host:port`, as TtsServer adds its port) and the metrics endpoint (prometheus_client's
    start_http_server on the bare host, as tts_service.__main__.start_metrics calls it) both bind the
    configured host; skips where this machine has no IPv6 and the host is an IPv6 address."""
    if ":" in config.bare_host and not _has_ipv6():
        pytest.skip(f"this machine cannot bind IPv6, which {config.host} needs")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))  # never started: binding is the question
    try:
        assert server.add_insecure_port(f"{config.host}:0") > 0, f"gRPC cannot bind {config.host}"
    finally:
        server.stop(None)
    started = start_http_server(0, addr=config.bare_host, registry=CollectorRegistry())
    if isinstance(started, tuple):  # prometheus_client >= 0.20: (server, thread)
        started[0].shutdown()
        started[0].server_close()


def _has_ipv6() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::", 0))
    except OSError:
        return False
    return True
