"""The chart's PrometheusRule and Grafana dashboard: rendered, shaped as their consumers expect,
and every metric and label they query is one the service really exports."""

from __future__ import annotations

import json
import re
from typing import Any

import helm_python as helm
import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from scehr.schemas.variables import VARIABLES
from scehr.service.metrics import Metrics
from tests.deploy.test_chart import CHART, RELEASE, render

DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")  # Prometheus' duration (the CRD's pattern)
SELECTOR = re.compile(r"\b(scehr_[a-z_]+)\s*(\{[^}]*\})?")
MATCHER = re.compile(r"([a-z_]+)\s*(=~|!~|!=|=)\s*\"([^\"]*)\"")
PROMQL_WORDS = {"by", "without", "on", "ignoring", "and", "or", "unless", "le", "pid"}


@pytest.fixture(scope="module")
def chart() -> helm.Chart:
    return helm.Chart.load(CHART)


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    """Sample name -> its label names, for every metric the service defines."""
    metrics = Metrics()
    out: dict[str, set[str]] = {}
    for m in vars(metrics).values():
        if not isinstance(m, MetricWrapperBase):
            continue
        labels = set(m._labelnames)
        name = m._name
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"],
                    "gauge": [""]}[m._type]
        for s in suffixes:
            out[name + s] = labels | ({"le"} if s == "_bucket" else set())
    return out


def check_expr(expr: str, exported: dict[str, set[str]]) -> set[str]:
    """Every scehr_* series in `expr` exists with the labels it matches on; parentheses and
    braces balance. Returns the metric names it uses."""
    assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr
    used = set()
    for name, selector in SELECTOR.findall(expr):
        assert name in exported, f"{name} is not exported by the service: {expr}"
        used.add(name)
        for label, _, value in MATCHER.findall(selector or ""):
            assert label in exported[name], f"{name} has no label {label}: {expr}"
            if label == "variable":  # the variables a drift rule names are the contract's
                ids = {v.id for v in VARIABLES}
                assert set(value.split("|")) <= ids, value
    for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        for label in filter(None, (x.strip() for x in group.split(","))):
            assert any(label in labels for n, labels in exported.items() if n in used) or (
                label == "pid"), f"no series in {expr!r} carries the label {label}"
    return used


def test_prometheus_rule_has_the_documented_alerts(chart: helm.Chart,
                                                   exported: dict[str, set[str]]) -> None:
    objs = render(chart, {"prometheusRule": {"enabled": True,
                                             "labels": {"release": "prom"}}})
    rule = objs[f"PrometheusRule/{RELEASE}-scehr"]
    # the CRD's shape (monitoring.coreos.com/v1, PrometheusRuleSpec), checked here: the
    # Kubernetes validator has no schema for CRDs
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert set(rule["spec"]) == {"groups"}
    names: list[str] = []
    used: set[str] = set()
    for group in rule["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "rules", "partial_response_strategy"}
        assert isinstance(group["name"], str) and group["rules"]
        for r in group["rules"]:
            assert set(r) <= {"alert", "record", "expr", "for", "keep_firing_for", "labels",
                              "annotations"}, r
            assert isinstance(r["alert"], str) and isinstance(r["expr"], str)
            assert DURATION.match(r["for"]), r["for"]
            assert all(isinstance(v, str) for v in r.get("labels", {}).values())
            assert all(isinstance(v, str) for v in r.get("annotations", {}).values())
            assert r["labels"]["severity"] in ("page", "ticket")
            used |= check_expr(r["expr"], exported)
            names.append(r["alert"])
    assert len(names) == len(set(names))
    # drift PSI, alert rate, latency, refusals: the families docs/monitoring.md describes
    assert {"ScehrInputDrift", "ScehrRiskDrift", "ScehrAlertRateOff", "ScehrVariableMissing",
            "ScehrLatencyHigh", "ScehrQueueWaitHigh", "ScehrRefusals"} <= set(names)
    assert {"scehr_monitor_value_psi", "scehr_monitor_risk_psi", "scehr_monitor_alert_rate",
            "scehr_request_duration_seconds_bucket", "scehr_overload_rejections_total"} <= used
    docs = (CHART.parents[1] / "docs" / "monitoring.md").read_text()
    assert all(n in docs for n in names), "docs/monitoring.md lists every shipped alert"
    assert not any(k.startswith("PrometheusRule/") for k in render(chart))  # opt-in


def dashboard_exprs(dash: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]


def test_grafana_dashboard_configmap_for_the_sidecar(chart: helm.Chart,
                                                     exported: dict[str, set[str]]) -> None:
    objs = render(chart, {"grafanaDashboard": {"enabled": True,
                                               "annotations": {"grafana_folder": "ICU"}}})
    cm = objs[f"ConfigMap/{RELEASE}-scehr-dashboard"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "ICU"}
    dash = json.loads(cm["data"]["scehr-dashboard.json"])
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"]
        assert {"h", "w", "x", "y"} <= set(p["gridPos"])
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
    used: set[str] = set()
    for _, expr in dashboard_exprs(dash):
        used |= check_expr(expr, exported)
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for topic in ("latency", "queue", "rows per onnx runtime run", "refusals", "drift"):
        assert topic in titles, topic
    assert {"scehr_queue_seconds_bucket", "scehr_batch_size_sum",
            "scehr_overload_rejections_total", "scehr_monitor_value_psi"} <= used
    assert not any(k.endswith("-dashboard") for k in render(chart))  # opt-in


def test_check_expr_catches_a_wrong_metric_or_label(exported: dict[str, set[str]]) -> None:
    """The checker itself fails on what it must catch (a renamed metric, a wrong label)."""
    with pytest.raises(AssertionError, match="not exported"):
        check_expr("rate(scehr_overload_rejections[5m])", exported)  # no _total
    with pytest.raises(AssertionError, match="no label"):
        check_expr('scehr_queue_seconds_bucket{endpoint="/x"}', exported)
    with pytest.raises(AssertionError):
        check_expr('scehr_monitor_value_psi{variable=~"ph|lactate"}', exported)


def test_rules_file_is_plain_prometheus_rules() -> None:
    """files/prometheus-rules.yaml loads as a Prometheus rule file too (promtool's format), so
    a site without the Operator can point rule_files at it."""
    doc = yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
    assert list(doc) == ["groups"] and all(g["rules"] for g in doc["groups"])


def _status_selected(expr: str, status: str) -> bool:
    """Whether every matcher on `status` in `expr` selects this status (Prometheus anchors
    regular expressions at both ends)."""
    ok = True
    for label, op, value in MATCHER.findall(expr):
        if label != "status":
            continue
        hit = re.fullmatch(value, status) is not None if op in ("=~", "!~") else value == status
        ok &= hit if op in ("=~", "=") else not hit
    return ok


def test_the_server_error_alert_counts_5xx_but_not_client_closed_or_overload() -> None:
    """A client that left before its answer is 499 (service/middleware.py CLIENT_CLOSED): no
    server error; the overload 503 has its own alert."""
    from scehr.service.middleware import CLIENT_CLOSED

    doc = yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
    rules = {r["alert"]: r for g in doc["groups"] for r in g["rules"]}
    expr = rules["ScehrServerErrors"]["expr"]
    assert "scehr_requests_total" in expr
    assert _status_selected(expr, "500") and _status_selected(expr, "504")
    assert not _status_selected(expr, str(CLIENT_CLOSED)) and CLIENT_CLOSED < 500
    assert not _status_selected(expr, "503") and not _status_selected(expr, "200")


def test_the_requests_panel_shows_every_scoring_interface() -> None:
    """The dashboard's requests-by-status panel selects the scoring routes of every interface
    (their templates, as the service counts them) and no other route."""
    from scehr.service.media_types import body_routes
    from scehr.service.routes import admin, cds_hooks, fhir, oip, predict

    dash = json.loads((CHART / "files" / "grafana-dashboard.json").read_text())
    [expr] = [e for title, e in dashboard_exprs(dash) if title.startswith("Scoring requests")]
    [(_, _, endpoints)] = [m for m in MATCHER.findall(expr) if m[0] == "endpoint"]
    routes = [r for m in (predict, fhir, cds_hooks, oip) for r in m.router.routes]
    scoring = {b.path for b in body_routes(routes)}
    # 3 single-stay tasks, batch, FHIR, CDS Hooks, 2 V2 infer; the trajectory's single, batch
    # and FHIR routes
    assert len(scoring) == 11
    assert all(re.fullmatch(endpoints, p) for p in scoring), scoring
    for other in [*(b.path for b in body_routes(admin.router.routes)), "/cds-services",
                  "/v2/models/{name}", "/models/{task}", "unmatched"]:
        assert not re.fullmatch(endpoints, other), other
