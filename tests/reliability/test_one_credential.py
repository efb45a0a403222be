"""One credential, one caller: a call that presents two credentials is refused on every front door, the caller and
the owner of voices come from the key that authenticated, and every refused call is counted."""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import Iterator

import grpc
import pytest
from prometheus_client import CollectorRegistry

from observability.metrics import ServiceMetrics
from qwen3_tts.v1.protocol import tts_pb2, tts_pb2_grpc
from tests.reliability.test_lockout import ORDINARY, trickling_requests
from tests.service.helpers import RunningServer, start_server
from tests.service.processes import free_port
from tts_service.api.callers import LOOPBACK_CALLER, Credentials, peer_address
from tts_service.api.errors import ApiError
from tts_service.model.checkpoint import LoadedModel

KEY = "key-alice"
OTHER_KEY = "key-bob"
SPEECH = {"model": "tts-1", "input": "Hello there.", "voice": "ryan", "response_format": "pcm"}
TWO_CREDENTIALS = {
    "junk bearer, then a valid x-api-key": (("authorization", "Bearer junk"), ("x-api-key", KEY)),
    "x-api-key twice": (("x-api-key", KEY), ("x-api-key", "junk")),
    "the same valid key twice": (("x-api-key", KEY), ("authorization", f"Bearer {KEY}")),
}


# -- the rule, without a server --------------------------------------------------------------------------------


@pytest.mark.parametrize("metadata", TWO_CREDENTIALS.values(), ids=TWO_CREDENTIALS.keys())
def test_two_credentials_are_refused_naming_the_rule(metadata: tuple[tuple[str, str], ...]) -> None:
    with pytest.raises(ApiError) as refused:
        Credentials([KEY]).authenticate(metadata)
    assert refused.value.code is grpc.StatusCode.UNAUTHENTICATED
    assert "exactly one credential" in refused.value.message and KEY not in refused.value.message


def test_the_caller_and_owner_are_the_key_that_authenticated() -> None:
    credentials = Credentials([KEY, OTHER_KEY])
    alice = credentials.identity((("x-api-key", KEY),), "ipv4:10.0.0.7:1")
    assert alice == credentials.identity((("authorization", f"Bearer {KEY}"),), "ipv4:10.0.0.8:2")
    bob = credentials.identity((("x-api-key", OTHER_KEY),), "ipv4:10.0.0.7:1")
    assert alice.caller != bob.caller and alice.owner != bob.owner
    assert KEY not in alice.caller + alice.owner


@pytest.mark.parametrize("peer", ["ipv4:127.0.0.1:5000", "ipv6:[::1]:5001", "ipv6:[::ffff:127.0.0.1]:5002",
                                  "ipv4:127.0.0.2:5003"])
def test_loopback_over_ipv4_and_ipv6_is_one_caller_without_keys(peer: str) -> None:
    assert Credentials([]).identity((), peer).caller == LOOPBACK_CALLER


def test_an_ipv4_client_is_one_caller_whether_its_address_comes_mapped_into_ipv6_or_not() -> None:
    assert peer_address("ipv6:[::ffff:10.0.0.7]:5000") == peer_address("ipv4:10.0.0.7:6000") == "ipv4:10.0.0.7"
    assert peer_address("ipv6:[2001:db8::7]:5000") == "ipv6:2001:db8::7"


# -- gRPC and HTTP -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed_server(tiny_models: dict[str, LoadedModel]) -> Iterator[tuple[RunningServer, int, ServiceMetrics]]:
    http_port = free_port()
    server = start_server(tiny_models["custom_voice"], with_engine=False, http_port=http_port,
                          max_calls_per_caller=2, stream_idle_timeout_seconds=30.0,
                          api_keys=frozenset({KEY, OTHER_KEY}))
    metrics = ServiceMetrics("(test)", "custom_voice", CollectorRegistry())
    server.attach_engine(metrics)
    yield server, http_port, metrics
    server.stop()


def _refused_count(metrics: ServiceMetrics, rpc: str, status: str) -> float:
    value = metrics.registry.get_sample_value("qwen3_tts_requests_total", {
        "model": "(test)", "mode": "custom_voice", "rpc": rpc, "status": status, "finish_reason": ""})
    return value or 0.0


def _post_speech(http_port: int, headers: list[tuple[str, str]], body: bytes = json.dumps(SPEECH).encode(),
                 content_type: str = "application/json") -> tuple[int, dict[str, str]]:
    """POST a speech request with exactly these headers (http.client sends a name twice if asked to)."""
    connection = http.client.HTTPConnection("127.0.0.1", http_port, timeout=60)
    try:
        connection.putrequest("POST", "/v1/audio/speech")
        for name, value in [("Content-Type", content_type), ("Content-Length", str(len(body))), *headers]:
            connection.putheader(name, value)
        connection.endheaders(body)
        response = connection.getresponse()
        data = response.read()
    finally:
        connection.close()
    return response.status, {} if response.status == 200 else json.loads(data)["error"]


@pytest.mark.parametrize("metadata", TWO_CREDENTIALS.values(), ids=TWO_CREDENTIALS.keys())
def test_a_grpc_call_with_two_credentials_is_unauthenticated_and_counted(
        keyed_server: tuple[RunningServer, int, ServiceMetrics], metadata: tuple[tuple[str, str], ...]) -> None:
    server, _, metrics = keyed_server
    before = _refused_count(metrics, "Synthesize", "UNAUTHENTICATED")
    with server.client() as client, pytest.raises(grpc.RpcError) as refused:
        client.stub.Synthesize(ORDINARY, metadata=metadata, timeout=10)
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert "exactly one credential" in refused.value.details()
    assert _refused_count(metrics, "Synthesize", "UNAUTHENTICATED") == before + 1


def test_calls_without_a_valid_key_are_counted_as_unauthenticated_on_both_doors(
        keyed_server: tuple[RunningServer, int, ServiceMetrics]) -> None:
    server, http_port, metrics = keyed_server
    grpc_before = _refused_count(metrics, "ListVoices", "UNAUTHENTICATED")
    http_before = _refused_count(metrics, "OpenAISpeech", "UNAUTHENTICATED")
    with server.client() as client:
        for metadata in ((), (("x-api-key", "wrong"),), (("authorization", "Basic a2V5"),)):
            with pytest.raises(grpc.RpcError):
                client.stub.ListVoices(tts_pb2.ListVoicesRequest(), metadata=metadata, timeout=10)
    for headers in ([], [("x-api-key", "wrong")]):
        assert _post_speech(http_port, headers)[0] == 401
    assert _refused_count(metrics, "ListVoices", "UNAUTHENTICATED") == grpc_before + 3
    assert _refused_count(metrics, "OpenAISpeech", "UNAUTHENTICATED") == http_before + 2


def test_http_bodies_refused_before_they_are_parsed_are_counted_with_their_status(
        keyed_server: tuple[RunningServer, int, ServiceMetrics]) -> None:
    _, http_port, metrics = keyed_server
    before = _refused_count(metrics, "OpenAISpeech", "INVALID_ARGUMENT")
    assert _post_speech(http_port, [("X-Api-Key", KEY)], content_type="text/plain")[0] == 415
    assert _post_speech(http_port, [("X-Api-Key", KEY)], body=b"{not json")[0] == 400
    assert _refused_count(metrics, "OpenAISpeech", "INVALID_ARGUMENT") == before + 2


def test_an_http_request_with_two_credentials_is_401_naming_the_rule(
        keyed_server: tuple[RunningServer, int, ServiceMetrics]) -> None:
    _, http_port, _ = keyed_server
    for headers in ([("Authorization", "Bearer junk"), ("X-Api-Key", KEY)], [("X-Api-Key", KEY)] * 2):
        status, error = _post_speech(http_port, headers)
        assert status == 401 and "exactly one credential" in error["message"]
    assert _post_speech(http_port, [("X-Api-Key", KEY)])[0] == 200


def test_one_key_cannot_pose_as_several_callers_to_escape_its_limit(
        keyed_server: tuple[RunningServer, int, ServiceMetrics]) -> None:
    """With two calls held open under one key (the limit), no way of presenting that key gets a third call in, on
    either door, while another key is served."""
    server, http_port, _ = keyed_server

    async def scenario() -> list[str]:
        release = asyncio.Event()
        codes = []
        async with grpc.aio.insecure_channel(server.target) as channel:
            stub = tts_pb2_grpc.TextToSpeechStub(channel)
            held = [stub.StreamingSynthesize(trickling_requests(release), metadata=(("x-api-key", KEY),))
                    for _ in range(2)]
            for call in held:
                await call.initial_metadata()
            for metadata in ((("x-api-key", KEY),), (("authorization", f"Bearer {KEY}"),),
                             *TWO_CREDENTIALS.values()):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.Synthesize(ORDINARY, metadata=metadata, timeout=15)
                codes.append(refused.value.code().name)
            status, _ = await asyncio.to_thread(_post_speech, http_port, [("X-Api-Key", KEY)])
            codes.append(str(status))
            reply = await stub.Synthesize(ORDINARY, metadata=(("x-api-key", OTHER_KEY),), timeout=15)
            codes.append("other key served" if reply.completion.usage.audio_frames else "other key got nothing")
            release.set()
            for call in held:
                call.cancel()
        return codes

    codes = asyncio.run(scenario())
    assert codes == ["RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED", *["UNAUTHENTICATED"] * len(TWO_CREDENTIALS),
                     "429", "other key served"]

