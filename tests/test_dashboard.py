"""The Grafana dashboard (observability/grafana/qwen3-tts.json): a dashboard Grafana can provision, whose
queries name only metrics the service exports. (tests/service/test_observability.py runs every query
against a real Prometheus.)"""

from __future__ import annotations

import json
import re
from dataclasses import fields
from itertools import combinations
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from observability.metrics import LiveState, ServiceMetrics
from tts_service.api.openai_http import SPEECH_RPC

DASHBOARD_PATH = Path(__file__).resolve().parents[1] / "observability" / "grafana" / "qwen3-tts.json"
GRID_COLUMNS = 24
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# What Grafana's dashboard model requires of a provisioned dashboard, for the parts this one uses.
DASHBOARD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "panels", "templating", "time"],
    "properties": {
        "uid": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,40}$"},
        "title": {"type": "string", "minLength": 1},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "time": {"type": "object", "required": ["from", "to"]},
        "panels": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/panel"}},
        "templating": {"type": "object", "required": ["list"],
                       "properties": {"list": {"type": "array", "items": {"$ref": "#/$defs/variable"}}}},
    },
    "$defs": {
        "gridPos": {"type": "object", "required": ["x", "y", "w", "h"], "properties": {
            "x": {"type": "integer", "minimum": 0, "maximum": GRID_COLUMNS - 1},
            "y": {"type": "integer", "minimum": 0},
            "w": {"type": "integer", "minimum": 1, "maximum": GRID_COLUMNS},
            "h": {"type": "integer", "minimum": 1}}},
        "panel": {"type": "object", "required": ["id", "type", "title", "gridPos"], "properties": {
            "id": {"type": "integer", "minimum": 1},
            "type": {"enum": ["row", "timeseries", "stat", "gauge", "bargauge", "table", "heatmap", "text"]},
            "title": {"type": "string", "minLength": 1},
            "gridPos": {"$ref": "#/$defs/gridPos"}},
            "if": {"properties": {"type": {"not": {"const": "row"}}}},
            "then": {"required": ["datasource", "targets", "fieldConfig"], "properties": {
                "datasource": {"const": DATASOURCE},
                "targets": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "required": ["refId", "expr", "datasource"],
                    "properties": {"refId": {"type": "string", "minLength": 1},
                                   "expr": {"type": "string", "minLength": 1},
                                   "datasource": {"const": DATASOURCE}}}}}}},
        "variable": {"type": "object", "required": ["name", "type"], "properties": {
            "name": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"},
            "type": {"enum": ["datasource", "query", "custom", "constant", "interval"]}}},
    },
}
# What the service's operators asked to see, as words each panel title must contain.
REQUIRED_PANELS = ("time to first audio", "real-time factor", "audio seconds per second", "requests",
                   "underruns", "errors by front door and status", "calls per second by front door", "kv cache",
                   "step time", "batch size")


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_PATH.read_text())


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [panel for panel in dashboard["panels"] if panel["type"] != "row"]


def test_the_dashboard_matches_grafanas_dashboard_model(dashboard: dict[str, Any]) -> None:
    jsonschema.validate(dashboard, DASHBOARD_SCHEMA)


def test_panels_have_unique_ids_and_do_not_overlap_on_the_grid(dashboard: dict[str, Any]) -> None:
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    boxes = [panel["gridPos"] for panel in dashboard["panels"]]
    for box in boxes:
        assert box["x"] + box["w"] <= GRID_COLUMNS
    for a, b in combinations(boxes, 2):
        overlaps = (a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"]
                    and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"])
        assert not overlaps, (a, b)
    for panel in panels(dashboard):
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]


def test_a_datasource_variable_and_model_and_instance_variables_drive_every_query(dashboard: dict[str, Any]) -> None:
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("model", "instance"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"] == DATASOURCE
        assert variables[name]["query"]["query"].startswith("label_values(")
    for panel in panels(dashboard):
        for target in panel["targets"]:
            assert 'model=~"$model"' in target["expr"] and 'instance=~"$instance"' in target["expr"], panel["title"]


def test_the_operators_panels_are_there(dashboard: dict[str, Any]) -> None:
    titles = [panel["title"].lower() for panel in panels(dashboard)]
    for words in REQUIRED_PANELS:
        assert any(words in title for title in titles), words
    time_to_first_audio = next(panel for panel in panels(dashboard) if panel["title"] == "Time to first audio")
    assert [target["legendFormat"] for target in time_to_first_audio["targets"]] == ["p50", "p95", "p99"]


def test_the_call_panels_tell_the_two_front_doors_apart(dashboard: dict[str, Any]) -> None:
    by_door = [panel for panel in panels(dashboard) if "front door" in panel["title"].lower()]
    assert len(by_door) == 2
    for panel in by_door:
        (target,) = panel["targets"]
        # The HTTP front door's calls are counted under the rpc label the OpenAI-compatible API uses.
        assert f'"door", "HTTP", "rpc", "{SPEECH_RPC}"' in target["expr"]
        assert '"door", "gRPC", "rpc", ".+"' in target["expr"]
        assert "{{door}}" in target["legendFormat"]


def exported_metric_names() -> set[str]:
    """Every sample name a server exports, with every gauge registered."""
    metrics = ServiceMetrics("tiny", "custom_voice")
    metrics.watch(LiveState(*(lambda: 0,) * len(fields(LiveState))))
    metrics.set_cuda_graphs({"decode": [1]})
    metrics.build_info.info({"version": "0"})
    for histogram in (metrics.time_to_first_audio, metrics.realtime_factor):
        histogram.labels(model="tiny", mode="custom_voice").observe(0.1)
    metrics.requests.labels(model="tiny", mode="custom_voice", rpc="Synthesize", status="OK",
                            finish_reason="length").inc()
    from prometheus_client import generate_latest

    text = generate_latest(metrics.registry).decode()
    names = {family.name for family in text_string_to_metric_families(text)}
    # A family's samples: the counter's _total, the histogram's _bucket/_sum/_count, the info's _info.
    return names | {name + suffix for name in names for suffix in ("_total", "_bucket", "_sum", "_count", "_info")}


def test_every_query_names_only_metrics_the_service_exports(dashboard: dict[str, Any]) -> None:
    exported = exported_metric_names()
    for panel in panels(dashboard):
        for target in panel["targets"]:
            for name in re.findall(r"\bqwen3_tts_[a-z0-9_]+", target["expr"]):
                assert name in exported, f"{panel['title']}: {name} is not exported"
