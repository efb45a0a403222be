"""Whether the server's listeners can bind the host a deployment configures, bound by the server itself."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace

import pytest

from tests.service.processes import free_port
from tts_service.api.config import ServerConfig
from tts_service.api.server import TtsServer


def check_bindable(config: ServerConfig) -> None:
    """The server starts on the configured host, gRPC on a free port and /metrics on another; on every
    interface, the metrics port answers on each loopback address, IPv4 and IPv6, as gRPC's does. Skips where
    this machine has no IPv6 and the host needs it."""
    needs_ipv6 = ":" in config.bare_host
    if needs_ipv6 and not _has_ipv6():
        pytest.skip(f"this machine cannot bind IPv6, which {config.host} needs")
    # Binding is the question: TLS files (stand-ins in the chart's tests) and the health port play no part in it.
    config = replace(config, port=0, metrics_port=free_port(), health_port=None, tls_cert=None, tls_key=None,
                     tls_client_ca=None)
    loopbacks = {"::": ["127.0.0.1", "::1"], "0.0.0.0": ["127.0.0.1"]}.get(config.bare_host, [])

    async def start_and_stop() -> None:
        server = TtsServer(config)
        await server.start()
        try:
            for address in loopbacks:
                socket.create_connection((address, config.metrics_port), timeout=5).close()
        finally:
            await server.shutdown()

    asyncio.run(start_and_stop())


def _has_ipv6() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::", 0))
    except OSError:
        return False
    return True
