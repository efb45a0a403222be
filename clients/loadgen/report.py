"""The run's summary: percentiles, errors by status, requests in flight, underruns, and the generator's own lag.

Underruns are counted two ways per completed request (observability/playback.py): strict, the
project's definition (playback starts at the first chunk with no pre-roll and each later chunk is due
at that moment plus its offset; any chunk after its due time makes the request an underrun), and with
a 100 ms continuity threshold, vLLM-Omni's (a player that pauses when it runs dry and resumes when
the next chunk arrives; the request is an underrun only if some such pause exceeds 100 ms).
"""

from __future__ import annotations

import math
from collections import Counter

from clients.loadgen.run import RequestRecord


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
    late = [r for r in completed if r.underruns.num_late_chunks]
    paused = [r for r in completed if r.continuity_underruns.num_late_chunks]
    return {
        "num_requests": len(records), "num_completed": len(completed),
        "errors_by_status": dict(Counter(r.status for r in records if r.status != "OK")),
        "ttfa_ms": {f"p{int(q * 100)}": _ms(percentile(ttfa, q)) for q in (0.5, 0.9, 0.95, 0.99)},
        "end_to_end_ms": {"p50": _ms(percentile(end_to_end, 0.5)), "p95": _ms(percentile(end_to_end, 0.95))},
        "rtf": {"p50": percentile(rtf, 0.5), "p95": percentile(rtf, 0.95), "max": max(rtf, default=None)},
        "num_requests_with_underruns": len(late),
        "underrun_s": {"total": sum(r.underruns.total_s for r in completed),
                       "max": max((r.underruns.max_s for r in completed), default=0.0)},
        "num_requests_with_gaps_over_100ms": len(paused),
        "gap_over_100ms_s": {"total": sum(r.continuity_underruns.total_s for r in completed),
                             "max": max((r.continuity_underruns.max_s for r in completed), default=0.0)},
        "peak_in_flight": peak_in_flight(records),
        "achieved_requests_per_s": len(records) / wall_s if wall_s > 0 else None,
        "audio_s_per_wall_s": sum(r.audio_s for r in completed) / wall_s if wall_s > 0 else None,
        "start_lag_ms": {"p95": _ms(percentile(lag, 0.95)), "max": _ms(max(lag, default=None))},
    }


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
              f"{'gap>100ms reqs':>14} {'underrun max ms':>16} {'lag p95 ms':>11}")
    errors = sum(summary["errors_by_status"].values())
    row = (f"{load:>6} {summary['num_requests']:>5} {summary['num_completed']:>5} {errors:>7} "
           f"{number(summary['ttfa_ms']['p50']):>9} {number(summary['ttfa_ms']['p95']):>9} "
           f"{number(summary['ttfa_ms']['p99']):>9} {number(summary['rtf']['p50'], 2):>8} "
           f"{number(summary['rtf']['max'], 2):>8} {summary['peak_in_flight']:>14} "
           f"{number(summary['audio_s_per_wall_s'], 1):>9} {summary['num_requests_with_underruns']:>14} "
           f"{summary['num_requests_with_gaps_over_100ms']:>14} "
           f"{number(1e3 * summary['underrun_s']['max']):>16} {number(summary['start_lag_ms']['p95'], 1):>11}")
    return f"{header}\n{row}"
