"""API keys (UNAUTHENTICATED without a valid one), TLS and mutual TLS with freshly generated certificates."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clients.qwen3_tts_client import Connection, TtsClient, tts_pb2
from clients.qwen3_tts_client.client import synthesize_request
from qwen3_tts.v1.protocol import SERVICE_NAME, tts_pb2_grpc
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


@dataclass(frozen=True)
class Pem:
    certificate: bytes
    key: bytes


def _issue(subject: str, issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None, is_ca: bool,
           hosts: tuple[str, ...] = ()) -> tuple[Pem, x509.Name, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name, issuer_key = issuer or (name, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer_name).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True))
    if hosts:
        names = [x509.DNSName(host) if not host[0].isdigit() else x509.IPAddress(ipaddress.ip_address(host))
                 for host in hosts]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    certificate = builder.sign(issuer_key, hashes.SHA256())
    pem = Pem(certificate.public_bytes(serialization.Encoding.PEM),
              key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()))
    return pem, name, key


@dataclass(frozen=True)
class Certificates:
    ca: Pem
    server: Pem
    client: Pem


@pytest.fixture(scope="module")
def certificates() -> Certificates:
    ca, ca_name, ca_key = _issue("test CA", None, is_ca=True)
    server, _, _ = _issue("localhost", (ca_name, ca_key), is_ca=False, hosts=("localhost", "127.0.0.1"))
    client, _, _ = _issue("test client", (ca_name, ca_key), is_ca=False)
    return Certificates(ca, server, client)


def _write(directory: Path, certificates: Certificates) -> dict[str, Path]:
    paths = {"tls_cert": directory / "server.pem", "tls_key": directory / "server.key",
             "tls_client_ca": directory / "ca.pem"}
    paths["tls_cert"].write_bytes(certificates.server.certificate)
    paths["tls_key"].write_bytes(certificates.server.key)
    paths["tls_client_ca"].write_bytes(certificates.ca.certificate)
    return paths


def _tls_client(server: RunningServer, certificates: Certificates, with_client_certificate: bool) -> TtsClient:
    client = certificates.client if with_client_certificate else None
    return TtsClient(Connection(target=f"localhost:{server.server.port}", root_certificates=certificates.ca.certificate,
                                private_key=client.key if client else None,
                                certificate_chain=client.certificate if client else None))


def test_tls_serves_clients_that_trust_its_ca_and_refuses_plaintext(tiny_models: dict[str, LoadedModel],
                                                                    certificates: Certificates,
                                                                    tmp_path: Path) -> None:
    paths = _write(tmp_path, certificates)
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
    server = start_server(tiny_models["custom_voice"], host="localhost", **_write(tmp_path, certificates))
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
                          **_write(tmp_path, certificates))
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
