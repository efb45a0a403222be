"""Issue 14's "over gRPC, at least 90% of the in-process audio seconds per second at the same concurrency": the
load generator's closed-loop reports against the engine benchmark's levels on the same requests.

    python -m benchmarks.ceiling --grpc OUT/grpc --engine OUT/engine-loadgen.json --out OUT/ceiling.json

`--grpc` holds `loadgen-c<N>.json.gz`, one per concurrency N (`python -m clients.loadgen --concurrency N
--requests M --rpc online --seed S`); the engine report comes from `python -m benchmarks.engine --workload loadgen
--seed S --requests-per-level M --non-streaming-text`, so both ran the same texts and audio lengths.
`benchmarks/device_ceiling.sh` runs all three on a GPU machine.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from clients.loadgen.__main__ import read_report

TARGET_SHARE = 0.9


def load_levels(grpc_dir: Path) -> dict[int, dict]:
    """The closed-loop reports in `grpc_dir`, by their concurrency."""
    levels = {}
    for path in sorted(grpc_dir.glob("loadgen-c*.json*")):
        match = re.fullmatch(r"loadgen-c(\d+)\.json(\.gz)?", path.name)
        if match is None:
            continue
        report = read_report(path)
        concurrency = report["settings"].get("concurrency")
        if concurrency != int(match.group(1)):
            raise ValueError(f"{path.name}: a closed loop at {concurrency} in flight, not {match.group(1)}")
        levels[concurrency] = report
    if not levels:
        raise ValueError(f"no loadgen-c<N>.json[.gz] reports in {grpc_dir}")
    return levels


def compare(grpc: dict[int, dict], engine: dict) -> list[dict]:
    """One row per concurrency the two share; a concurrency only one of them ran is an error."""
    in_process = {level["concurrency"]: level for level in engine["levels"]}
    if set(grpc) != set(in_process):
        raise ValueError(f"concurrencies differ: gRPC {sorted(grpc)}, in process {sorted(in_process)}")
    if engine.get("workload") != "loadgen":
        raise ValueError("the engine report must come from --workload loadgen, the load generator's requests")
    rows = []
    for concurrency in sorted(grpc):
        report, level = grpc[concurrency], in_process[concurrency]
        if report["settings"]["num_requests"] != level["num_requests"]:
            raise ValueError(f"at {concurrency} in flight the runs sent {report['settings']['num_requests']} and "
                             f"{level['num_requests']} requests")
        summary = report["summary"]
        over_grpc, local = summary["audio_s_per_wall_s"], level["audio_s_per_wall_s"]
        rows.append({"concurrency": concurrency, "num_requests": level["num_requests"],
                     "grpc_audio_s_per_s": over_grpc, "in_process_audio_s_per_s": local,
                     "grpc_share": over_grpc / local, "is_target_met": over_grpc >= TARGET_SHARE * local,
                     "grpc_errors": sum(summary["errors_by_status"].values()),
                     "grpc_requests_with_underruns": summary["num_requests_with_underruns"],
                     "grpc_ttfa_ms": summary["ttfa_ms"], "in_process_late_requests": level["num_requests_late"]})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grpc", type=Path, required=True, help="directory of loadgen-c<N>.json[.gz] reports")
    parser.add_argument("--engine", type=Path, required=True, help="benchmarks.engine --workload loadgen report")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        rows = compare(load_levels(args.grpc), read_report(args.engine))
    except ValueError as error:
        parser.error(str(error))
    report = {"benchmark": "ceiling", "date": time.strftime("%Y-%m-%d"), "target_share": TARGET_SHARE,
              "command": " ".join(["python -m benchmarks.ceiling", *(argv or sys.argv[1:])]), "levels": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    lines = [f"{'conc':>5} {'reqs':>5} {'gRPC audio s/s':>15} {'in process':>11} {'share':>7} {'>= 90%':>7} "
             f"{'gRPC errors':>12} {'underruns':>10}"]
    lines += [f"{r['concurrency']:>5} {r['num_requests']:>5} {r['grpc_audio_s_per_s']:>15.1f} "
              f"{r['in_process_audio_s_per_s']:>11.1f} {100 * r['grpc_share']:>6.1f}% "
              f"{'yes' if r['is_target_met'] else 'no':>7} {r['grpc_errors']:>12} "
              f"{r['grpc_requests_with_underruns']:>10}" for r in rows]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
