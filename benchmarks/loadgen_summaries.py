"""The summaries of a folder's load generator reports (`lg-NAME.json.gz`) gathered into its `summary.json`, keyed by
NAME, the reports themselves removed: a device run brings back the figures, not megabytes of per-request records.

    python3 -m benchmarks.loadgen_summaries DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from clients.loadgen.__main__ import read_report


def gather(folder: Path) -> dict[str, dict]:
    summaries = {}
    for path in sorted(folder.glob("lg-*.json.gz")):
        summaries[path.name.removeprefix("lg-").removesuffix(".json.gz")] = read_report(path)["summary"]
        path.unlink()
    (folder / "summary.json").write_text(json.dumps(summaries, indent=1))
    return summaries


if __name__ == "__main__":
    gather(Path(sys.argv[1]))
