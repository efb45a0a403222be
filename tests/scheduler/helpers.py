"""Small builders and a fake runner loop shared by the scheduler tests."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from scheduler.outputs import RequestEvent, SchedulerOutput, StepResult
from scheduler.request import Request
from scheduler.scheduler import Scheduler, SchedulerConfig

# Deadline protection off unless a test turns it on: slack is never below this.
NO_PLAYBACK_PROTECTION = -1e9


def make_config(**overrides: Any) -> SchedulerConfig:
    """Small test sizes; the product's defaults live in the engine's config, not here."""
    settings: dict[str, Any] = {
        "max_running": 8,
        "max_waiting": 16,
        "max_prefill_positions_per_step": 64,
        "block_size": 4,
        "num_kv_blocks": 256,
        "codec_chunk_schedule": (1, 2, 4, 8, 12),
        "min_playback_slack_s": NO_PLAYBACK_PROTECTION,
        "max_prefill_positions_at_risk": 256,
        "frame_duration_s": 0.08,
    }
    settings.update(overrides)
    return SchedulerConfig(**settings)


def make_request(request_id: str, num_prompt_positions: int = 8, max_frames: int = 100,
                 arrival_time: float = 0.0, **overrides: Any) -> Request:
    """A request whose text input is closed unless the test says otherwise, so it never parks."""
    overrides.setdefault("is_text_closed", True)
    return Request(request_id, num_prompt_positions, max_frames, arrival_time, **overrides)


def run_step(scheduler: Scheduler, now: float = 0.0, eos_ids: Collection[str] = (),
             errors: Mapping[str, str] | None = None) -> tuple[SchedulerOutput, list[RequestEvent]]:
    """One engine step with a runner that produces a frame for every scheduled request."""
    output = scheduler.schedule(now)
    if output.is_empty:
        return output, []
    return output, scheduler.update(StepResult.for_output(output, eos_ids, errors), now)


def run_steps(scheduler: Scheduler, num_steps: int, start: float = 0.0,
              step_s: float = 0.01) -> list[SchedulerOutput]:
    return [run_step(scheduler, start + index * step_s)[0] for index in range(num_steps)]


def ids(items: Iterable[Any]) -> list[str]:
    return [item.request_id for item in items]
