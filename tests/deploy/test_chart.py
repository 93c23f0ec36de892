"""helm/scehr rendered by Helm's own engine (no cluster) and every manifest validated against
the Kubernetes API schema; then what matters is asserted on the objects."""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from scehr.service.app import create_app
from scehr.service.settings import Settings
from tests.conftest import REPO

CHART = REPO / "helm" / "scehr"
KUBE = "1.34.0"  # a current Kubernetes (backoffLimitPerIndex is GA since 1.33)
RELEASE = "demo"


@pytest.fixture(scope="module")
def chart() -> helm.Chart:
    return helm.Chart.load(CHART)


def render(chart: helm.Chart, values: dict[str, Any] | None = None) -> dict[str, dict]:
    """kind/name -> object, every object validated against the Kubernetes schema."""
    out: dict[str, dict] = {}
    for path, text in chart.render(values or {}, name=RELEASE, namespace="icu").items():
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if not doc:
                continue
            if doc["apiVersion"].startswith("monitoring.coreos.com/"):
                # CRDs: no schema in the validator; the PrometheusRule's shape is checked in
                # test_observability.py
                assert doc["kind"] in ("ServiceMonitor", "PrometheusRule")
            else:
                kubernetes_validate.validate(doc, KUBE, strict=True)
            out[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return out


def container(objs: dict[str, dict], kind: str = "Deployment") -> dict:
    obj = next(o for k, o in objs.items() if k.startswith(kind + "/"))
    return obj["spec"]["template"]["spec"]["containers"][0]


def test_lint_is_clean() -> None:
    report = helm.lint(CHART, strict=True, kube_version=f"v{KUBE}")
    assert not report["errors"], report
    assert all(m["severity"] < 2 for m in report["messages"]), report


def test_defaults_hardened_probes_on_real_routes(chart: helm.Chart) -> None:
    objs = render(chart)
    assert {k.split("/")[0] for k in objs} == {
        "ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget",
        "NetworkPolicy", "ServiceAccount", "Pod"}
    routes = set(create_app(Settings(model_dir=REPO / "models")).openapi()["paths"])
    c = container(objs)
    for probe, path in (("startupProbe", "/livez"), ("readinessProbe", "/readyz"),
                        ("livenessProbe", "/livez")):
        assert c[probe]["httpGet"]["path"] == path and path in routes
        assert c[probe]["httpGet"]["port"] == "http"
    pod = objs[f"Deployment/{RELEASE}-scehr"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    assert "nvidia.com/gpu" not in str(c["resources"])
    assert c["args"][:5] == ["serve", "--host", "0.0.0.0", "--port", "8000"]
    assert "replicas" not in objs[f"Deployment/{RELEASE}-scehr"]["spec"]  # the HPA owns it
    cm = objs[f"ConfigMap/{RELEASE}-scehr"]["data"]
    assert cm["SCEHR_MODEL_DIR"] == "/opt/scehr/models" and "SCEHR_API_KEYS" not in cm
    test_pod = objs[f"Pod/{RELEASE}-scehr-test"]
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = test_pod["spec"]["containers"][0]["args"][0]
    assert "/readyz" in script and "/predict/mortality" in script
    compile(script, "helm-test", "exec")  # the test pod's program is valid Python
    hpa = objs[f"HorizontalPodAutoscaler/{RELEASE}-scehr"]["spec"]
    assert [m["type"] for m in hpa["metrics"]] == ["Resource"]


def test_image_variant_follows_gpu_and_the_test_pod_uses_it(chart: helm.Chart) -> None:
    """Without a GPU the CPU image (no CUDA, runs on any node); the helm test pod and the batch
    Job run the very image the Deployment serves."""
    batch = {"batch": {"enabled": True, "volume": {"claimName": "d"}}}
    for values, tag in (({}, "0.1.0-cpu"), ({"gpu": {"enabled": True}}, "0.1.0"),
                        ({"image": {"tag": "site-7"}}, "site-7")):
        objs = render(chart, {**values, **batch})
        image = container(objs)["image"]
        assert image == f"scehr:{tag}"
        assert objs[f"Pod/{RELEASE}-scehr-test"]["spec"]["containers"][0]["image"] == image
        assert container(objs, "Job")["image"] == image
    notes = chart.render({}, name=RELEASE, namespace="icu")["scehr/templates/NOTES.txt"]
    assert "No scehr image is published" in notes and "VARIANT=cpu" in notes


def test_gpu_request_only_when_enabled(chart: helm.Chart) -> None:
    objs = render(chart, {"gpu": {"enabled": True, "count": 1},
                          "nodeSelector": {"nvidia.com/gpu.present": "true"},
                          "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                           "effect": "NoSchedule"}]})
    c = container(objs)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    pod = objs[f"Deployment/{RELEASE}-scehr"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_hpa_with_a_custom_metric(chart: helm.Chart) -> None:
    objs = render(chart, {"autoscaling": {"customMetric": {"enabled": True}}})
    metrics = objs[f"HorizontalPodAutoscaler/{RELEASE}-scehr"]["spec"]["metrics"]
    assert metrics[1]["type"] == "Pods"
    assert metrics[1]["pods"]["metric"]["name"] == "scehr_queue_seconds_p90"
    objs = render(chart, {"autoscaling": {"enabled": False}, "replicaCount": 3})
    assert objs[f"Deployment/{RELEASE}-scehr"]["spec"]["replicas"] == 3
    assert not any(k.startswith("HorizontalPodAutoscaler") for k in objs)


def test_service_monitor_scrapes_metrics(chart: helm.Chart) -> None:
    objs = render(chart, {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}})
    sm = objs[f"ServiceMonitor/{RELEASE}-scehr"]
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["endpoints"][0] == {"port": "http", "path": "/metrics", "interval": "30s",
                                          "scrapeTimeout": "10s"}
    svc = objs[f"Service/{RELEASE}-scehr"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()


@pytest.mark.parametrize("source", ["pvc", "initImage"])
def test_model_sources(chart: helm.Chart, source: str) -> None:
    values = {"models": {"source": source, "pvc": {"claimName": "scehr-models"},
                         "initImage": {"repository": "registry/scehr-models", "tag": "1.1.0"}}}
    objs = render(chart, values)
    pod = objs[f"Deployment/{RELEASE}-scehr"]["spec"]["template"]["spec"]
    vol = next(v for v in pod["volumes"] if v["name"] == "models")
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "models")
    assert mount == {"name": "models", "mountPath": "/opt/scehr/models", "readOnly": True}
    if source == "pvc":
        assert vol["persistentVolumeClaim"] == {"claimName": "scehr-models", "readOnly": True}
        assert "initContainers" not in pod
    else:
        assert "emptyDir" in vol
        init = pod["initContainers"][0]
        assert init["image"] == "registry/scehr-models:1.1.0"
        assert init["command"] == ["cp", "-R", "/models/.", "/target/"]
        assert init["securityContext"]["readOnlyRootFilesystem"]


def test_batch_job_is_indexed_with_one_shard_per_completion(chart: helm.Chart) -> None:
    objs = render(chart, {"batch": {"enabled": True, "shards": 6, "parallelism": 4,
                                    "volume": {"claimName": "icu-data"}}})
    job = objs[f"Job/{RELEASE}-scehr-score"]["spec"]
    assert job["completionMode"] == "Indexed" and job["completions"] == 6
    assert job["parallelism"] == 4 and job["backoffLimitPerIndex"] == 2
    assert job["template"]["spec"]["restartPolicy"] == "Never"  # backoffLimitPerIndex needs it
    c = job["template"]["spec"]["containers"][0]
    args = c["args"]
    n = int(args[args.index("--shard") + 1].split("/")[1])
    assert n == job["completions"]
    assert args[:3] == ["score", "mortality", "/data/input/stays.jsonl"]
    assert args[args.index("--shard") + 1] == "$(SHARD_INDEX)/6"
    assert args[args.index("--out") + 1] == "/data/output/part-$(SHARD_INDEX)-of-6.jsonl"
    env = {e["name"]: e for e in c["env"]}
    assert env["SHARD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']")
    pod_labels = job["template"]["metadata"]["labels"]
    svc_selector = objs[f"Service/{RELEASE}-scehr"]["spec"]["selector"]
    assert not svc_selector.items() <= pod_labels.items()  # the Service never routes to it
    assert c["securityContext"]["readOnlyRootFilesystem"]
    assert render(chart, {"batch": {"enabled": True, "shards": 3, "volume": {
        "claimName": "d"}}})[f"Job/{RELEASE}-scehr-score"]["spec"]["parallelism"] == 3


def test_api_keys_come_from_an_existing_secret(chart: helm.Chart) -> None:
    objs = render(chart, {"apiKeys": {"existingSecret": "scehr-keys"}})
    for c in (container(objs), objs[f"Pod/{RELEASE}-scehr-test"]["spec"]["containers"][0]):
        ref = next(e for e in c["env"] if e["name"] == "SCEHR_API_KEYS")
        assert ref["valueFrom"]["secretKeyRef"] == {"name": "scehr-keys", "key": "api-keys"}


def test_network_policy_allows_only_the_service_port_and_dns(chart: helm.Chart) -> None:
    np = render(chart)[f"NetworkPolicy/{RELEASE}-scehr"]["spec"]
    assert np["ingress"] == [{"ports": [{"port": "http", "protocol": "TCP"}]}]
    assert {p["port"] for rule in np["egress"] for p in rule["ports"]} == {53}


@pytest.mark.parametrize(("values", "where"), [
    ({"replicaCount": -1}, "/replicaCount"),
    ({"workers": 0}, "/workers"),
    ({"gpu": {"count": 0}}, "/gpu/count"),
    ({"models": {"source": "s3"}}, "/models/source"),
    ({"models": {"source": "pvc"}}, "/models/pvc/claimName"),
    ({"batch": {"enabled": True}}, "/batch/volume/claimName"),
    ({"batch": {"shards": 0}}, "/batch/shards"),
    ({"settings": {"SCEHR_API_KEYS": "secret"}}, "/settings"),
    ({"replicas": 2}, "replicas"),
])
def test_schema_rejects_bad_values(chart: helm.Chart, values: dict, where: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(where)):
        chart.render(values, name=RELEASE)


TRAINING = {"training": {"enabled": True, "image": {"tag": "0.1.0"},
                         "data": {"claimName": "icu-data"}, "runs": {"claimName": "icu-runs"}}}


def test_training_job_runs_torchrun_with_a_c10d_rendezvous_at_pod_0(chart: helm.Chart) -> None:
    assert not any("train" in k for k in render(chart))  # off by default
    objs = render(chart, {"training": {**TRAINING["training"], "pods": 3, "gpusPerPod": 4,
                                       "extraArgs": ["--batch-size", "1024"]}})
    name = f"{RELEASE}-scehr-train"
    svc, job = objs[f"Service/{name}"]["spec"], objs[f"Job/{name}"]["spec"]
    assert svc["clusterIP"] == "None" and svc["publishNotReadyAddresses"]
    pod = job["template"]["spec"]
    assert job["completionMode"] == "Indexed" and job["completions"] == job["parallelism"] == 3
    assert pod["subdomain"] == name and pod["restartPolicy"] == "Never"
    assert svc["selector"].items() <= job["template"]["metadata"]["labels"].items()
    serving = objs[f"Service/{RELEASE}-scehr"]["spec"]["selector"]
    assert not serving.items() <= job["template"]["metadata"]["labels"].items()
    c = pod["containers"][0]
    args = c["command"] + c["args"]
    port = svc["ports"][0]["port"]
    assert args[:6] == ["torchrun", "--nnodes=3", "--nproc-per-node=4", "--rdzv-backend=c10d",
                        f"--rdzv-endpoint={name}-0.{name}:{port}", f"--rdzv-id={name}"]
    assert args[6:9] == ["-m", "scehr.cli", "train"] and args[-2:] == ["--batch-size", "1024"]
    assert args[args.index("--data") + 1] == "/data/mortality"
    assert args[args.index("--out") + 1] == "/runs/mortality-run"
    assert "--config" not in args and "--nproc" not in args
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert c["image"] == "scehr-train:0.1.0" and c["securityContext"]["readOnlyRootFilesystem"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["data"]["readOnly"] and not mounts["runs"].get("readOnly")
    claims = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName")
              for v in pod["volumes"]}
    assert claims["data"] == "icu-data" and claims["runs"] == "icu-runs"
    assert {v["name"]: v for v in pod["volumes"]}["shm"]["emptyDir"]["medium"] == "Memory"
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["SCEHR_CACHE_DIR"].startswith(mounts["runs"]["mountPath"] + "/")

    cpu = render(chart, {"training": {**TRAINING["training"], "processesPerPod": 2,
                                      "config": "/data/configs/mortality.toml"}})
    c = cpu[f"Job/{name}"]["spec"]["template"]["spec"]["containers"][0]
    assert "--nproc-per-node=2" in c["args"] and "nvidia.com/gpu" not in str(c["resources"])
    assert c["args"][c["args"].index("--config") + 1] == "/data/configs/mortality.toml"


@pytest.mark.parametrize(("values", "where"), [
    ({"training": {"enabled": True}}, "/training/image/tag"),
    ({"training": {**TRAINING["training"], "runs": {"claimName": ""}}},
     "/training/runs/claimName"),
    ({"training": {**TRAINING["training"], "data": {"claimName": ""}}},
     "/training/data/claimName"),
    ({"training": {"pods": 0}}, "/training/pods"),
    ({"training": {"runName": "../x"}}, "/training/runName"),
])
def test_schema_rejects_bad_training_values(chart: helm.Chart, values: dict,
                                            where: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(where)):
        chart.render(values, name=RELEASE)
