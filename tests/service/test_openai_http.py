"""The OpenAI-compatible HTTP API of a real server process, through the official `openai` package (and raw HTTP
where the package cannot show what is sent: server-sent events, error bodies, a client that leaves)."""

from __future__ import annotations

import base64
import io
import json
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import soundfile as sf

from clients.qwen3_tts_client import Connection, TtsClient, Voice, VoiceReference
from tests.service.helpers import start_server, wait_until
from tests.service.processes import ServerProcess, free_port, server_process
from tests.service.test_voice_clone import pcm16_samples, wav_file
from tts_service.api.config import ConfigError, ServerConfig
from tts_service.api.errors import ApiError
from tts_service.api.openai_http import parse_speech
from tts_service.engine import ModelInfo
from tts_service.model.checkpoint import LoadedModel

API_KEY = "test-key-1"
SAMPLE_RATE = 24000
SPEECH = {"model": "tts-1", "voice": "ryan", "input": "Hello there."}
LIMITS = ServerConfig().input_limits


@dataclass
class HttpServer:
    process: ServerProcess
    base_url: str
    metrics_url: str
    http_port: int

    def client(self, api_key: str = API_KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key=api_key, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    http_port, metrics_port = free_port(), free_port()
    with server_process(tmp_path_factory.mktemp("openai-http"), "--http-port", str(http_port), "--metrics-port",
                        str(metrics_port), "--max-audio-seconds", "2",
                        env={"QWEN3_TTS_API_KEYS": API_KEY}) as running:
        yield HttpServer(running, f"http://127.0.0.1:{http_port}/v1", f"http://127.0.0.1:{metrics_port}/metrics",
                         http_port)


def post_speech(server: HttpServer, body: Any, api_key: str | None = API_KEY) -> tuple[int, dict[str, str], bytes]:
    """POST /v1/audio/speech with `body` (bytes as they are, anything else as JSON): status, headers, body."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(f"{server.base_url}/audio/speech", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def decode(audio: bytes, response_format: str) -> tuple[np.ndarray, int]:
    if response_format == "pcm":  # headerless: 16-bit little-endian mono at 24 kHz, as OpenAI's pcm
        return sf.read(io.BytesIO(audio), samplerate=SAMPLE_RATE, channels=1, format="RAW", subtype="PCM_16",
                       endian="LITTLE")
    return sf.read(io.BytesIO(audio))


def requests_counted(server: HttpServer, status: str, finish_reason: str = "") -> float:
    """qwen3_tts_requests_total for OpenAISpeech calls that ended with `status` (and `finish_reason`, if given)."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("qwen3_tts_requests_total{") and 'rpc="OpenAISpeech"' in line \
                and f'status="{status}"' in line and (not finish_reason or f'finish_reason="{finish_reason}"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_the_model_list_names_the_served_model(http_server: HttpServer) -> None:
    models = http_server.client().models.list()
    assert [model.id for model in models.data] == ["random:tiny-custom_voice"]


@pytest.mark.parametrize("response_format", ["wav", "pcm", "flac", "mp3", "opus"])
def test_speech_in_each_format_decodes_as_24_khz_audio(http_server: HttpServer, response_format: str) -> None:
    response = http_server.client().audio.speech.create(model="tts-1", voice="ryan", input="Hello there.",
                                                         response_format=response_format)
    samples, rate = decode(response.content, response_format)
    assert rate == SAMPLE_RATE
    assert len(samples) > 0


def test_the_served_models_own_id_is_accepted_as_the_model(http_server: HttpServer) -> None:
    response = http_server.client().audio.speech.create(model="random:tiny-custom_voice", voice="Ryan",
                                                         input="Hello.", response_format="wav")
    assert len(decode(response.content, "wav")[0]) > 0


@pytest.mark.parametrize(("response_format", "content_type"), [("wav", "audio/wav"), ("mp3", "audio/mpeg")])
def test_streamed_audio_arrives_in_several_chunks_that_make_one_decodable_stream(
        http_server: HttpServer, response_format: str, content_type: str) -> None:
    speech = http_server.client().audio.speech.with_streaming_response
    with speech.create(model="tts-1", voice="ryan", input="Hello there, how are you?",
                       response_format=response_format) as response:
        assert response.headers["content-type"] == content_type
        chunks = [chunk for chunk in response.iter_bytes() if chunk]
    assert len(chunks) > 1
    samples, rate = decode(b"".join(chunks), response_format)
    assert rate == SAMPLE_RATE and len(samples) > 0


def test_sse_sends_base64_audio_deltas_then_done_with_usage(http_server: HttpServer) -> None:
    status, headers, body = post_speech(http_server, {**SPEECH, "response_format": "pcm", "stream_format": "sse"})
    assert status == 200 and headers["Content-Type"] == "text/event-stream"
    events = [json.loads(line.removeprefix("data: ")) for line in body.decode().splitlines() if line]
    deltas, done = events[:-1], events[-1]
    assert deltas and all(event["type"] == "speech.audio.delta" for event in deltas)
    audio = b"".join(base64.b64decode(event["audio"]) for event in deltas)
    assert len(decode(audio, "pcm")[0]) == len(audio) // 2 > 0
    assert done["type"] == "speech.audio.done"
    usage = done["usage"]
    assert usage["output_tokens"] > 0 and usage["input_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_a_wrong_api_key_is_refused_with_401(http_server: HttpServer) -> None:
    with pytest.raises(openai.AuthenticationError) as refused:
        http_server.client(api_key="not-a-key").audio.speech.create(**SPEECH)
    assert refused.value.status_code == 401
    with pytest.raises(openai.AuthenticationError):
        http_server.client(api_key="not-a-key").models.list()


def test_a_missing_api_key_is_refused_with_401_and_openais_error_json(http_server: HttpServer) -> None:
    status, _, body = post_speech(http_server, SPEECH, api_key=None)
    assert status == 401
    assert json.loads(body)["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(("change", "param"), [
    ({"voice": "alloy"}, "voice"),
    ({"voice": None}, "voice"),
    ({"input": ""}, "input"),
    ({"input": "x" * 200_001}, "input"),  # past --max-document-chars
    ({"speed": 1.5}, "speed"),
    ({"response_format": "aac"}, "response_format"),
    ({"stream_format": "video"}, "stream_format"),
    ({"instructions": 7}, "instructions"),
])
def test_bad_input_is_a_400_naming_the_parameter(http_server: HttpServer, change: dict[str, Any], param: str) -> None:
    body = {key: value for key, value in {**SPEECH, **change}.items() if value is not None}
    status, headers, answer = post_speech(http_server, body)
    assert status == 400 and headers["Content-Type"].startswith("application/json")
    error = json.loads(answer)["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"{param}:")


def test_a_body_that_is_not_json_is_a_400(http_server: HttpServer) -> None:
    status, _, answer = post_speech(http_server, b"{not json")
    assert status == 400
    assert json.loads(answer)["error"]["param"] == "body"


def test_the_openai_client_raises_bad_request_naming_the_parameter(http_server: HttpServer) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        http_server.client().audio.speech.create(model="tts-1", voice="ryan", input="Hello.", response_format="aac")
    assert refused.value.body["param"] == "response_format"  # type: ignore[index]
    assert "mp3, opus, flac, wav, pcm" in refused.value.body["message"]  # type: ignore[index]


def test_an_unknown_model_is_a_404_model_not_found(http_server: HttpServer) -> None:
    with pytest.raises(openai.NotFoundError) as refused:
        http_server.client().audio.speech.create(model="whisper-1", voice="ryan", input="Hello.")
    assert refused.value.code == "model_not_found"


def test_the_server_keeps_serving_after_bad_requests(http_server: HttpServer) -> None:
    for body in (b"[", {**SPEECH, "voice": "nobody"}, {**SPEECH, "model": "nope"}, {**SPEECH, "speed": 0}):
        assert post_speech(http_server, body)[0] in (400, 404)
    status, _, audio = post_speech(http_server, {**SPEECH, "response_format": "wav"})
    assert status == 200 and len(decode(audio, "wav")[0]) > 0


def test_http_calls_are_counted_under_their_own_rpc_label(http_server: HttpServer) -> None:
    ok, invalid = requests_counted(http_server, "OK"), requests_counted(http_server, "INVALID_ARGUMENT")
    assert post_speech(http_server, SPEECH)[0] == 200
    assert post_speech(http_server, {**SPEECH, "voice": "nobody"})[0] == 400
    assert requests_counted(http_server, "OK") == ok + 1
    assert requests_counted(http_server, "INVALID_ARGUMENT") == invalid + 1


def test_a_client_that_disconnects_mid_stream_aborts_its_request(http_server: HttpServer) -> None:
    aborted = requests_counted(http_server, "CANCELLED", "aborted")
    body = json.dumps({**SPEECH, "input": "A longer sentence to keep the model talking for a while.",
                       "response_format": "pcm"}).encode()
    with socket.create_connection(("127.0.0.1", http_server.http_port), timeout=30) as connection:
        connection.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                           + f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                           + body)
        first = connection.recv(4096)  # the headers, and the first audio with them or soon after
        assert re.match(rb"HTTP/1\.1 200", first)
    assert wait_until(lambda: requests_counted(http_server, "CANCELLED", "aborted") == aborted + 1, timeout_s=20)


# -- the request's translation, without a server -----------------------------------------------------------------


@pytest.fixture(scope="module")
def model_infos(tiny_models: dict[str, LoadedModel]) -> dict[str, ModelInfo]:
    return {kind: ModelInfo.of(model) for kind, model in tiny_models.items()}


def test_a_voice_design_model_takes_its_voice_description_from_instructions(
        model_infos: dict[str, ModelInfo]) -> None:
    model = model_infos["voice_design"]
    speech = parse_speech({**SPEECH, "instructions": "a calm, low voice"}, model, LIMITS)
    assert speech.voice.instruction == "a calm, low voice" and not speech.voice.speaker
    with pytest.raises(ApiError) as refused:
        parse_speech(SPEECH, model, LIMITS)
    assert refused.value.field == "instructions"


def test_on_a_base_model_the_voice_names_a_registered_voice(model_infos: dict[str, ModelInfo]) -> None:
    speech = parse_speech({**SPEECH, "voice": "voice_0123"}, model_infos["base"], LIMITS)
    assert speech.voice.voice_id == "voice_0123" and not speech.voice.speaker
    with pytest.raises(ApiError) as refused:
        parse_speech({**SPEECH, "voice": ""}, model_infos["base"], LIMITS)
    assert refused.value.field == "voice" and "CreateVoice" in refused.value.message


def test_a_voice_registered_over_grpc_speaks_through_the_openai_api(tmp_path: Path) -> None:
    """Clone once over gRPC, then any OpenAI client speaks with the voice by its id; another key's voice, or an
    unknown id, is 404 voice_not_found."""
    http_port = free_port()
    with server_process(tmp_path, "--http-port", str(http_port), env={"QWEN3_TTS_API_KEYS": "alice,bob"},
                        model="random:tiny-base") as grpc_server:
        server = HttpServer(grpc_server, f"http://127.0.0.1:{http_port}/v1", "", http_port)
        reference = VoiceReference(audio=wav_file(pcm16_samples(seed=3, seconds=1.0)), x_vector_only=True)
        with TtsClient(Connection(target=grpc_server.target, api_key="alice")) as alice:
            voice_id = alice.create_voice(reference).voice_id
        audio = server.client("alice").audio.speech.create(model="tts-1", voice=voice_id, input="Hello there.",
                                                           response_format="wav").read()
        samples, rate = decode(audio, "wav")
        assert rate == 24000 and samples.size > 0
        for api_key, voice in (("bob", voice_id), ("alice", "voice_" + "0" * 24)):
            status, _, body = post_speech(server, {**SPEECH, "voice": voice, "response_format": "wav"}, api_key)
            error = json.loads(body)["error"]
            assert (status, error["param"], error["code"]) == (404, "voice", "voice_not_found")


def test_the_defaults_are_openais_mp3_as_audio(model_infos: dict[str, ModelInfo]) -> None:
    speech = parse_speech(SPEECH, model_infos["custom_voice"], LIMITS)
    assert (speech.response_format, speech.stream_format, speech.voice.speaker) == ("mp3", "audio", "ryan")


def test_the_http_port_must_differ_from_the_grpc_port() -> None:
    with pytest.raises(ConfigError, match="--http-port"):
        ServerConfig(port=50051, http_port=50051)


def test_while_the_model_loads_the_http_api_answers_503_in_openais_shape() -> None:
    http_port = free_port()
    server = start_server(None, with_engine=False, http_port=http_port)
    try:
        for path, data in (("models", None), ("audio/speech", json.dumps(SPEECH).encode())):
            request = urllib.request.Request(f"http://127.0.0.1:{http_port}/v1/{path}", data=data,
                                             headers={"Content-Type": "application/json"})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=30)
            error = json.loads(refused.value.read())["error"]
            assert (refused.value.code, error["type"], error["code"]) == (503, "server_error", "service_unavailable")
            assert "loading" in error["message"]
    finally:
        server.stop()


def test_a_caller_past_its_call_limit_gets_429_in_openais_shape_across_both_front_doors(
        tiny_models: dict[str, LoadedModel]) -> None:
    """One caller's calls count together whichever door they use: with one call held open over gRPC, the same
    caller's HTTP request is refused with 429 rate_limit_exceeded, and served once the held call has ended."""
    http_port = free_port()
    server = start_server(tiny_models["custom_voice"], http_port=http_port, max_calls_per_caller=1,
                          max_audio_seconds=60.0)
    body = json.dumps({**SPEECH, "response_format": "pcm"}).encode()
    try:
        with server.client() as client:
            held = client.synthesize_online("Hello there.", Voice(speaker="ryan"))
            next(iter(held))  # the call is running: its first message has arrived
            request = urllib.request.Request(f"http://127.0.0.1:{http_port}/v1/audio/speech", data=body,
                                             headers={"Content-Type": "application/json"})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=30)
            error = json.loads(refused.value.read())["error"]
            assert (refused.value.code, error["type"], error["code"]) == (429, "rate_limit_error",
                                                                          "rate_limit_exceeded")
            assert "--max-calls-per-caller" in error["message"]
            held.cancel()
        assert wait_until(lambda: server.engine.num_live_requests == 0)
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200 and response.read()
    finally:
        server.stop()
