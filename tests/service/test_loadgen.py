"""The load generator: its schedule, its summary of stalls, and a short run against a real server."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from clients.loadgen.__main__ import main as loadgen_main
from clients.loadgen.__main__ import read_report, write_report
from clients.loadgen.report import peak_in_flight, percentile, summarize
from clients.loadgen.run import RequestRecord
from clients.loadgen.schedule import CHARACTERS_PER_SECOND, closed_loop_plan, poisson_schedule, texts
from clients.qwen3_tts_client import VoiceReference
from observability.playback import Stalls
from tests.service.helpers import RunningServer, start_server
from tests.service.test_voice_clone import REFERENCE_TEXT, pcm16_samples, wav_file
from tts_service.model.checkpoint import LoadedModel


def test_the_poisson_schedule_is_seeded_and_open_loop() -> None:
    first, again = poisson_schedule(20, 10, "mixed", seed=3), poisson_schedule(20, 10, "mixed", seed=3)
    assert first == again and first != poisson_schedule(20, 10, "mixed", seed=4)
    assert 120 < len(first) < 280  # 200 expected; a Poisson count this far out is a broken sampler
    starts = [request.start_s for request in first]
    assert starts == sorted(starts) and starts[0] > 0 and starts[-1] < 10
    assert {request.rpc for request in first} == {"online", "streaming"}


def test_a_closed_loop_plan_is_seeded_and_schedules_no_arrival_times() -> None:
    first = closed_loop_plan(40, "mixed", seed=3)
    assert first == closed_loop_plan(40, "mixed", seed=3) != closed_loop_plan(40, "mixed", seed=4)
    assert [request.index for request in first] == list(range(40))
    assert {request.start_s for request in first} == {0.0}
    assert {request.rpc for request in first} == {"online", "streaming"}
    assert len({request.text for request in first}) > 30
    with pytest.raises(ValueError, match="number of requests"):
        closed_loop_plan(0, "mixed", seed=3)


@pytest.mark.parametrize("arguments", [
    ["--rate", "3"],  # no --duration
    ["--concurrency", "2"],  # no --requests
    ["--rate", "3", "--duration", "2", "--concurrency", "2", "--requests", "4"],  # both loads
    [],  # neither
    ["--concurrency", "2", "--requests", "4", "--processes", "2"],  # worker processes share an open loop only
    ["--rate", "3", "--duration", "2", "--processes", "0"],
])
def test_the_loadgen_refuses_a_load_it_cannot_run(arguments: list[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        loadgen_main(["--server", "localhost:1", "--out", str(tmp_path / "never.json"), *arguments])
    assert exited.value.code == 2
    assert not (tmp_path / "never.json").exists()


def test_the_text_set_is_large_mostly_english_and_spread_from_short_to_long() -> None:
    shipped = texts()
    assert len(shipped) >= 500 and len({text.text for text in shipped}) == len(shipped)
    assert {text.language for text in shipped} == {"english", "chinese"}
    assert 0.15 <= sum(text.language == "chinese" for text in shipped) / len(shipped) <= 0.20
    words = [len(text.text.split()) for text in shipped if text.language == "english"]
    han = [len(re.findall(r"[\u4e00-\u9fff]", text.text)) for text in shipped if text.language == "chinese"]
    assert min(words) == 3 and max(words) <= 40 and min(han) >= 3 and max(han) <= 60
    # Spread, not just bounds: a fair share of short replies and of long explanations in each language.
    assert sum(w <= 6 for w in words) >= 20 and sum(w >= 25 for w in words) >= 20
    assert sum(c <= 8 for c in han) >= 10 and sum(c >= 30 for c in han) >= 10


def test_the_same_seed_picks_the_same_texts_from_across_the_set() -> None:
    def picks(seed: int, language: str | None = None) -> list[tuple[str, str]]:
        return [(r.text, r.language) for r in poisson_schedule(50, 40, "mixed", seed=seed, language=language)]

    first = picks(7)
    assert first == picks(7) and first != picks(8)
    assert len(set(first)) > 300 and {language for _, language in first} == {"english", "chinese"}
    assert {language for _, language in picks(7, "chinese")} == {"chinese"}
    with pytest.raises(ValueError, match="no texts"):
        poisson_schedule(1, 1, "mixed", seed=0, language="klingon")


def test_chinese_texts_ask_for_audio_at_a_mandarin_speaking_rate() -> None:
    # 4.5 characters a second: at the English rate a Chinese sentence would be cut to a third of its length.
    for request in poisson_schedule(20, 5, "mixed", seed=1, language="chinese"):
        assert request.max_audio_seconds == pytest.approx(max(0.16, len(request.text) / 4.5))


def test_a_text_cut_to_the_character_limit_asks_for_the_audio_of_what_is_left() -> None:
    for request in closed_loop_plan(30, "mixed", seed=2, max_text_chars=12):
        assert len(request.text) <= 12
        assert request.max_audio_seconds == pytest.approx(
            max(0.16, len(request.text) / CHARACTERS_PER_SECOND[request.language]))


NO_STALLS = Stalls()


def record(sent_s: float, finished_s: float, stalls: Stalls = NO_STALLS) -> RequestRecord:
    return RequestRecord(index=0, rpc="online", language="english", text_chars=1, scheduled_s=sent_s,
                         start_lag_s=0.0, finished_s=finished_s, status="OK", time_to_first_audio_s=None,
                         end_to_end_s=None, audio_s=0.0, realtime_factor=None, num_chunks=0, stalls=stalls,
                         finish_reason="")


def test_the_summary_counts_requests_that_stalled_and_sums_each_stall_once() -> None:
    summary = summarize([record(0, 1), record(0, 1, Stalls((0.06, 0.5))), record(0, 1, Stalls((0.04,)))],
                        wall_s=1.0)
    assert summary["num_requests_with_underruns"] == 2
    assert summary["stall_s"] == {"total": pytest.approx(0.6), "max": 0.5}
    assert summary["num_requests_with_stalls_over_100ms"] == 1
    assert summary["stall_over_100ms_s"] == {"total": 0.5, "max": 0.5}


def test_the_latest_words_message_is_reported_with_the_audio_the_listener_already_had_past_its_word() -> None:
    early_word = replace(record(0, 1), word_lags_s=(0.02, 0.6), word_audio_ahead_s=(0.1, 3.2))
    late_message = replace(record(0, 1), word_lags_s=(0.3,), word_audio_ahead_s=(0.05,))
    lags = summarize([early_word, late_message], wall_s=1.0)["word_lag_ms"]
    assert lags["max"] == pytest.approx(600) and lags["audio_ahead_s_at_max"] == 3.2 and lags["num_messages"] == 3
    assert summarize([record(0, 1)], wall_s=1.0)["word_lag_ms"]["audio_ahead_s_at_max"] is None


def test_peak_in_flight_counts_overlapping_requests_only() -> None:
    assert peak_in_flight([record(0, 3), record(1, 2), record(1.5, 4), record(3.5, 5)]) == 3
    assert peak_in_flight([record(0, 1), record(1, 2)]) == 1  # one finishing as the next is sent
    assert peak_in_flight([]) == 0


def test_percentile_is_nearest_rank() -> None:
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 0.5) == 3.0
    assert percentile([1.0, 2.0], 0.95) == 2.0 and percentile([], 0.5) is None


def run_loadgen(server: RunningServer, out: Path, *extra: str) -> dict:
    assert loadgen_main(["--server", server.target, "--rate", "3", "--duration", "2.5", "--max-audio-seconds", "0.4",
                         "--seed", "5", "--out", str(out), *extra]) == 0
    return json.loads(out.read_text())


def test_a_short_open_loop_run_completes_every_scheduled_request(custom_voice_server: RunningServer,
                                                                  tmp_path: Path) -> None:
    report = run_loadgen(custom_voice_server, tmp_path / "load.json", "--rpc", "mixed")
    requests, summary = report["requests"], report["summary"]
    assert len(requests) == len(report["schedule"]) == summary["num_requests"] > 0
    assert summary["num_completed"] == len(requests) and summary["errors_by_status"] == {}
    for record in requests:
        assert 0 < record["time_to_first_audio_s"] < record["end_to_end_s"]
        assert record["audio_s"] > 0 and record["num_chunks"] >= 1 and record["finish_reason"] == "length"
    assert {record["rpc"] for record in requests} <= {"online", "streaming"}
    assert summary["ttfa_ms"]["p50"] > 0 and summary["audio_s_per_wall_s"] > 0 and summary["peak_in_flight"] >= 1
    assert summary["num_requests_with_stalls_over_100ms"] <= summary["num_requests_with_underruns"]


def test_an_open_loop_shared_over_worker_processes_sends_each_request_once_at_its_time(
        custom_voice_server: RunningServer, tmp_path: Path) -> None:
    alone = run_loadgen(custom_voice_server, tmp_path / "alone.json", "--rpc", "mixed")
    shared = run_loadgen(custom_voice_server, tmp_path / "shared.json", "--rpc", "mixed", "--processes", "2")
    requests = shared["requests"]
    assert shared["schedule"] == alone["schedule"] and shared["settings"]["processes"] == 2
    assert [record["index"] for record in requests] == [planned["index"] for planned in shared["schedule"]]
    assert shared["summary"]["num_completed"] == len(requests) > 0
    # The clock starts once every worker is connected: no worker's start-up (about a second) counts as lag.
    assert max(record["start_lag_s"] for record in requests) < 0.5


def test_a_closed_loop_keeps_its_concurrency_in_flight_and_sends_each_call_when_one_ends(
        custom_voice_server: RunningServer, tmp_path: Path) -> None:
    out = tmp_path / "closed.json"
    assert loadgen_main(["--server", custom_voice_server.target, "--concurrency", "2", "--requests", "5",
                         "--max-audio-seconds", "0.4", "--rpc", "online", "--seed", "5", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    requests, summary = sorted(report["requests"], key=lambda r: r["index"]), report["summary"]
    assert summary["num_completed"] == 5 and summary["errors_by_status"] == {}
    assert summary["peak_in_flight"] == 2 and summary["audio_s_per_wall_s"] > 0
    assert report["settings"]["concurrency"] == 2 and report["settings"]["num_requests"] == 5
    assert all(record["start_lag_s"] == 0.0 for record in requests)
    sent = [record["scheduled_s"] for record in requests]
    assert sent == sorted(sent) and sent[0] < 0.1 and sent[1] < 0.1
    # The third call goes out when the first of the two before it has ended, not before.
    assert sent[2] >= min(requests[0]["finished_s"], requests[1]["finished_s"]) - 1e-3


def test_refused_requests_are_counted_by_status(custom_voice_server: RunningServer, tmp_path: Path) -> None:
    # SynthesizeOnline only: grpcio's asyncio client can report a refused bidirectional call as
    # INTERNAL "Internal error from Core" when its own writes race the server's status (grpc#36066).
    report = run_loadgen(custom_voice_server, tmp_path / "refused.json", "--rpc", "online", "--speaker", "nobody")
    summary = report["summary"]
    assert summary["num_completed"] == 0
    assert summary["errors_by_status"] == {"INVALID_ARGUMENT": summary["num_requests"]}
    assert all(record["time_to_first_audio_s"] is None for record in report["requests"])


def test_the_loadgen_reads_the_servers_limits_and_keeps_every_request_inside_them(
        tiny_models: dict[str, LoadedModel], tmp_path: Path) -> None:
    max_audio_seconds, max_text_chars = 0.32, 24
    unbounded = closed_loop_plan(6, "mixed", seed=5)
    # Left to itself the generator would ask for more of both, and the server would refuse those calls.
    assert any(len(request.text) > max_text_chars for request in unbounded)
    assert any(request.max_audio_seconds > max_audio_seconds for request in unbounded)
    server = start_server(tiny_models["custom_voice"], max_audio_seconds=max_audio_seconds,
                          max_text_chars=max_text_chars)
    out = tmp_path / "limits.json"
    try:
        assert loadgen_main(["--server", server.target, "--concurrency", "2", "--requests", "6", "--rpc", "mixed",
                             "--seed", "5", "--out", str(out)]) == 0
    finally:
        server.stop()
    report = json.loads(out.read_text())
    assert report["settings"]["server_limits"] == {"max_audio_seconds": pytest.approx(max_audio_seconds),
                                                   "max_text_chars": max_text_chars}
    assert report["summary"]["num_completed"] == 6 and report["summary"]["errors_by_status"] == {}
    for request in report["schedule"]:
        assert len(request["text"]) <= max_text_chars and request["max_audio_seconds"] <= max_audio_seconds


def test_with_word_timestamps_every_request_gets_words_and_the_report_says_how_far_they_trail(
        tiny_models: dict[str, LoadedModel], tmp_path: Path) -> None:
    server = start_server(tiny_models["custom_voice"], aligner_model="random:tiny")
    out = tmp_path / "words.json"
    try:
        assert loadgen_main(["--server", server.target, "--concurrency", "2", "--requests", "4", "--rpc", "mixed",
                             "--max-audio-seconds", "0.4", "--word-timestamps", "--out", str(out)]) == 0
    finally:
        server.stop()
    report = json.loads(out.read_text())
    assert report["summary"]["num_completed"] == 4 and report["settings"]["word_timestamps"] is True
    assert all(request["word_lags_s"] for request in report["requests"])
    assert all(len(request["word_audio_ahead_s"]) == len(request["word_lags_s"]) for request in report["requests"])
    assert all(ahead >= 0 for request in report["requests"] for ahead in request["word_audio_ahead_s"])
    lags = report["summary"]["word_lag_ms"]
    assert lags["num_messages"] >= 4 and 0 <= lags["p50"] <= lags["p95"] <= lags["max"]


def test_with_a_voice_id_every_request_speaks_the_registered_voice(base_server: RunningServer,
                                                                     tmp_path: Path) -> None:
    with base_server.client() as client:
        reference = VoiceReference(audio=wav_file(pcm16_samples(seed=0)), text=REFERENCE_TEXT)
        voice = client.create_voice(reference, timeout=60)
    report = run_loadgen(base_server, tmp_path / "voice.json", "--rpc", "mixed", "--voice-id", voice.voice_id)
    assert report["settings"]["voice_id"] == voice.voice_id and report["settings"]["speaker"] == ""
    assert report["summary"]["num_completed"] == report["summary"]["num_requests"] > 0
    # A Base model has no speakers: without the voice the same load is refused, so the voice is what carried it.
    refused = run_loadgen(base_server, tmp_path / "speaker.json", "--rpc", "online")
    assert refused["summary"]["num_completed"] == 0 and set(refused["summary"]["errors_by_status"]) == {
        "INVALID_ARGUMENT"}


def test_with_a_reference_recording_every_request_clones_it_inline(base_server: RunningServer,
                                                                    tmp_path: Path) -> None:
    recording = tmp_path / "reference.wav"
    recording.write_bytes(wav_file(pcm16_samples(seed=0)))
    report = run_loadgen(base_server, tmp_path / "inline.json", "--rpc", "mixed", "--reference-audio", str(recording),
                         "--reference-text", REFERENCE_TEXT)
    assert report["settings"]["reference_audio"] == str(recording)
    assert report["settings"]["reference_text"] == REFERENCE_TEXT
    assert report["summary"]["num_completed"] == report["summary"]["num_requests"] > 0


def test_the_loadgen_takes_a_speaker_or_a_voice_id_not_both(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        loadgen_main(["--server", "localhost:1", "--rate", "1", "--duration", "1", "--speaker", "ryan", "--voice-id",
                      "v", "--out", str(tmp_path / "never.json")])
    assert "--voice-id: not allowed with argument --speaker" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["report.json", "report.json.gz"])
def test_a_report_reads_back_as_written_compressed_or_not(tmp_path: Path, name: str) -> None:
    report = {"summary": {"ttfa_ms": {"p50": 21.5}}, "requests": [{"index": 0, "text": "你好"}]}
    write_report(tmp_path / "out" / name, report)
    assert read_report(tmp_path / "out" / name) == report
    if name.endswith(".gz"):
        assert (tmp_path / "out" / name).read_bytes()[:2] == b"\x1f\x8b"
