"""API keys (UNAUTHENTICATED without a valid one), TLS and mutual TLS with freshly generated certificates."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clients.qwen3_tts_client import Connection, TtsClient, tts_pb2
from clients.qwen3_tts_client.client import synthesize_request
from qwen3_tts.v1.protocol import SERVICE_NAME, tts_pb2_grpc
from tests.service.certificates import Certificates, issue_certificates, write_certificates
from tests.service.helpers import GREEDY, RYAN, RunningServer, start_server
from tests.service.processes import free_port
from tts_service.model.checkpoint import LoadedModel

API_KEY = "test-key-0123456789"


@pytest.fixture(scope="module")
def keyed_server(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    running = start_server(tiny_models["custom_voice"], api_keys=frozenset({API_KEY, "another-key"}))
    yield running
    running.stop()


@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer wrong-key"),), (("x-api-key", "wrong-key"),),
                                      (("authorization", API_KEY),)],
                         ids=["missing", "wrong bearer", "wrong x-api-key", "bearer scheme missing"])
def test_calls_without_a_valid_api_key_are_unauthenticated(keyed_server: RunningServer,
                                                           metadata: tuple[tuple[str, str], ...]) -> None:
    with keyed_server.client() as client:
        with pytest.raises(grpc.RpcError) as caught:
            client.stub.ListVoices(tts_pb2.ListVoicesRequest(), metadata=metadata, timeout=5)
        assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert API_KEY not in caught.value.details() and "wrong-key" not in caught.value.details()
        with pytest.raises(grpc.RpcError) as streamed:
            list(client.stub.SynthesizeOnline(synthesize_request("Hello.", RYAN, generation=GREEDY),
                                              metadata=metadata, timeout=5))
        assert streamed.value.code() is grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("metadata", [(("authorization", f"Bearer {API_KEY}"),), (("x-api-key", API_KEY),),
                                      (("authorization", "bearer another-key"),)],
                         ids=["bearer", "x-api-key", "second key, lower-case scheme"])
def test_calls_with_a_valid_api_key_are_served(keyed_server: RunningServer,
                                               metadata: tuple[tuple[str, str], ...]) -> None:
    with keyed_server.client() as client:
        assert client.stub.ListVoices(tts_pb2.ListVoicesRequest(), metadata=metadata, timeout=5).speakers


def test_the_client_sends_its_api_key_and_health_checks_need_none(keyed_server: RunningServer) -> None:
    with keyed_server.client(api_key=API_KEY) as client:
        assert client.list_voices().speakers
    with keyed_server.client() as anonymous:
        check = health_pb2_grpc.HealthStub(anonymous.channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert check.status == health_pb2.HealthCheckResponse.SERVING


# -- TLS -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificates() -> Certificates:
    return issue_certificates()


def _tls_client(server: RunningServer, certificates: Certificates, with_client_certificate: bool) -> TtsClient:
    client = certificates.client if with_client_certificate else None
    return TtsClient(Connection(target=f"localhost:{server.server.port}", root_certificates=certificates.ca.certificate,
                                private_key=client.key if client else None,
                                certificate_chain=client.certificate if client else None))


def test_tls_serves_clients_that_trust_its_ca_and_refuses_plaintext(tiny_models: dict[str, LoadedModel],
                                                                    certificates: Certificates,
                                                                    tmp_path: Path) -> None:
    paths = write_certificates(tmp_path, certificates)
    server = start_server(tiny_models["custom_voice"], with_engine=False, host="localhost",
                          tls_cert=paths["tls_cert"], tls_key=paths["tls_key"])
    try:
        server.attach_engine()
        with _tls_client(server, certificates, with_client_certificate=False) as client:
            assert client.list_voices(timeout=5).speakers
        with server.client(target=f"localhost:{server.server.port}") as plaintext, \
                pytest.raises(grpc.RpcError) as caught:
            plaintext.list_voices(timeout=5)
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop()


def test_mutual_tls_requires_a_client_certificate_signed_by_the_client_ca(tiny_models: dict[str, LoadedModel],
                                                                         certificates: Certificates,
                                                                         tmp_path: Path) -> None:
    server = start_server(tiny_models["custom_voice"], host="localhost", **write_certificates(tmp_path, certificates))
    try:
        with _tls_client(server, certificates, with_client_certificate=True) as client:
            assert client.list_voices(timeout=5).speakers
        with _tls_client(server, certificates, with_client_certificate=False) as client, \
                pytest.raises(grpc.RpcError) as caught:
            client.list_voices(timeout=5)
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop()


def test_a_tls_server_offers_plaintext_health_alone_on_its_health_port(tiny_models: dict[str, LoadedModel],
                                                                      certificates: Certificates,
                                                                      tmp_path: Path) -> None:
    server = start_server(tiny_models["custom_voice"], host="localhost", health_port=free_port(),
                          **write_certificates(tmp_path, certificates))
    try:
        with grpc.insecure_channel(f"localhost:{server.server.health_port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", SERVICE_NAME):
                reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as caught:
                tts_pb2_grpc.TextToSpeechStub(channel).ListVoices(tts_pb2.ListVoicesRequest(), timeout=5)
            assert caught.value.code() is grpc.StatusCode.UNIMPLEMENTED
    finally:
        server.stop()
