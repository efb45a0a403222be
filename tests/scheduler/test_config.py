from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.scheduler.helpers import make_config

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("overrides", [
    {"max_running": 0},
    {"max_waiting": -1},
    {"max_prefill_positions_per_step": 0},
    {"max_prefill_positions_at_risk": 0},
    {"block_size": 0},
    {"num_kv_blocks": 0},
    {"max_running": True},
    {"codec_chunk_schedule": ()},
    {"codec_chunk_schedule": (1, 0, 4)},
    {"min_playback_slack_s": float("nan")},
    {"frame_duration_s": 0.0},
    {"max_running": 8, "max_slots": 4},
    {"max_positions_per_request": 0},
])
def test_config_rejects_invalid_values(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        make_config(**overrides)


def test_config_slots_default_to_max_running() -> None:
    assert make_config(max_running=8).num_slots == 8
    assert make_config(max_running=8, max_slots=12).num_slots == 12


def test_scheduler_package_does_not_import_torch() -> None:
    code = ("import sys; import scheduler.scheduler, scheduler.outputs, scheduler.kv_blocks; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)
