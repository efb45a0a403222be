"""Logs: one JSON object per line (or plain text for a terminal), tagged with the call that logged.

A speech call binds its request id and trace id at its start; every record logged afterwards by
that call's task, or by tasks it starts, carries them. asyncio copies the context into each task,
so one call's ids never leak into another's records.
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar
from datetime import UTC, datetime

LOG_FORMATS = ("json", "text")
_NO_CALL = {"request_id": "-", "trace_id": "-"}
_call_ids: ContextVar[dict[str, str]] = ContextVar("qwen3_tts_call_ids", default=_NO_CALL)


def bind_call(request_id: str, trace_id: str | None) -> None:
    """Tag the records this task (and the tasks it starts from now on) logs with the call's ids."""
    _call_ids.set({"request_id": request_id, "trace_id": trace_id or "-"})


class CallIdsFilter(logging.Filter):
    """Adds `request_id` and `trace_id` to every record ("-" outside a call)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _call_ids.get().items():
            setattr(record, key, value)
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
                 "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        for key in _NO_CALL:
            value = getattr(record, key, "-")
            if value != "-":
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str, log_format: str) -> None:
    """The root logger writes to stderr in `log_format` ("json" or "text") at `level`."""
    handler = logging.StreamHandler()
    handler.addFilter(CallIdsFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
