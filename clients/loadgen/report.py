"""The run's summary: percentiles, errors by status, requests in flight, underruns, and the generator's own lag.

Underruns are the stalls of each completed request (observability/playback.py, the definition the server's
`qwen3_tts_underrun_seconds` uses): a player that starts at the first chunk with no pre-roll pauses whenever it runs
out of audio and resumes when the next chunk arrives, and each such pause is one stall. A request with any stall
underran; `stall_s` sums and takes the longest of all stalls. The stalls longer than 100 ms are summarised again,
as vLLM-Omni's continuity threshold counts them.
"""

from __future__ import annotations

import math
from collections import Counter

from clients.loadgen.run import RequestRecord
from observability.playback import Stalls

# vLLM-Omni counts a gap in playback only past 100 ms; the same view of our stalls makes the two comparable.
_LONG_STALL_S = 0.1


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def summarize(records: list[RequestRecord], wall_s: float) -> dict:
    completed = [record for record in records if record.status == "OK"]
    ttfa = [r.time_to_first_audio_s for r in completed if r.time_to_first_audio_s is not None]
    end_to_end = [r.end_to_end_s for r in completed if r.end_to_end_s is not None]
    rtf = [r.realtime_factor for r in completed if r.realtime_factor is not None]
    lag = [record.start_lag_s for record in records]
    every_stall = [r.stalls for r in completed]
    long_stalls = [r.stalls.longer_than(_LONG_STALL_S) for r in completed]
    return {
        "num_requests": len(records), "num_completed": len(completed),
        "errors_by_status": dict(Counter(r.status for r in records if r.status != "OK")),
        "ttfa_ms": {f"p{int(q * 100)}": _ms(percentile(ttfa, q)) for q in (0.5, 0.9, 0.95, 0.99)},
        "end_to_end_ms": {"p50": _ms(percentile(end_to_end, 0.5)), "p95": _ms(percentile(end_to_end, 0.95))},
        "rtf": {"p50": percentile(rtf, 0.5), "p95": percentile(rtf, 0.95), "max": max(rtf, default=None)},
        "num_requests_with_underruns": _num_stalled(every_stall), "stall_s": _stall_totals(every_stall),
        "num_requests_with_stalls_over_100ms": _num_stalled(long_stalls),
        "stall_over_100ms_s": _stall_totals(long_stalls),
        "peak_in_flight": peak_in_flight(records),
        "achieved_requests_per_s": len(records) / wall_s if wall_s > 0 else None,
        "audio_s_per_wall_s": sum(r.audio_s for r in completed) / wall_s if wall_s > 0 else None,
        "start_lag_ms": {"p95": _ms(percentile(lag, 0.95)), "max": _ms(max(lag, default=None))},
        "word_lag_ms": _word_lags(completed),
    }


def _word_lags(completed: list[RequestRecord]) -> dict[str, float | int | None]:
    """With word timestamps: how long each message of words came after the audio of its last word; and for the
    latest, how much audio past that word the listener already had then."""
    messages = [(lag, ahead) for record in completed
                for lag, ahead in zip(record.word_lags_s, record.word_audio_ahead_s, strict=True)]
    lags = [lag for lag, _ in messages]
    return {"p50": _ms(percentile(lags, 0.5)), "p95": _ms(percentile(lags, 0.95)),
            "max": _ms(max(lags, default=None)), "num_messages": len(lags),
            "audio_ahead_s_at_max": max(messages)[1] if messages else None}


def _num_stalled(per_request: list[Stalls]) -> int:
    return sum(1 for request_stalls in per_request if request_stalls.count)


def _stall_totals(per_request: list[Stalls]) -> dict[str, float]:
    """All the requests' stalls: their total seconds and the longest one."""
    return {"total": sum(request_stalls.total_s for request_stalls in per_request),
            "max": max((request_stalls.max_s for request_stalls in per_request), default=0.0)}


def peak_in_flight(records: list[RequestRecord]) -> int:
    """The most requests sent and not yet finished at any one moment, failed ones included."""
    # At equal times a finish sorts before a send (-1 < +1), so back-to-back requests do not overlap.
    events = sorted([(r.scheduled_s + r.start_lag_s, 1) for r in records] + [(r.finished_s, -1) for r in records])
    in_flight = peak = 0
    for _, change in events:
        in_flight += change
        peak = max(peak, in_flight)
    return peak


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1e3 * seconds


def table(load: str, summary: dict) -> str:
    """One row under a header; `load` names the offered load ("20" for 20 req/s, "c128" for a closed loop)."""
    def number(value: float | None, digits: int = 0) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    header = (f"{'load':>6} {'reqs':>5} {'ok':>5} {'errors':>7} {'ttfa p50':>9} {'ttfa p95':>9} {'ttfa p99':>9} "
              f"{'rtf p50':>8} {'rtf max':>8} {'peak in flight':>14} {'audio s/s':>9} {'underrun reqs':>14} "
              f"{'stall>100ms reqs':>16} {'stall max ms':>13} {'stall total s':>13} {'lag p95 ms':>11} "
              f"{'words p95 ms':>12}")
    errors = sum(summary["errors_by_status"].values())
    row = (f"{load:>6} {summary['num_requests']:>5} {summary['num_completed']:>5} {errors:>7} "
           f"{number(summary['ttfa_ms']['p50']):>9} {number(summary['ttfa_ms']['p95']):>9} "
           f"{number(summary['ttfa_ms']['p99']):>9} {number(summary['rtf']['p50'], 2):>8} "
           f"{number(summary['rtf']['max'], 2):>8} {summary['peak_in_flight']:>14} "
           f"{number(summary['audio_s_per_wall_s'], 1):>9} {summary['num_requests_with_underruns']:>14} "
           f"{summary['num_requests_with_stalls_over_100ms']:>16} {number(1e3 * summary['stall_s']['max']):>13} "
           f"{number(summary['stall_s']['total'], 2):>13} {number(summary['start_lag_ms']['p95'], 1):>11} "
           f"{number(summary['word_lag_ms']['p95']):>12}")
    return f"{header}\n{row}"
