"""Prometheus metrics of the service; names and labels are part of its public interface.

| name | type | labels |
| --- | --- | --- |
| scehr_requests_total | counter | endpoint, model, status |
| scehr_request_duration_seconds | histogram | endpoint, model, status |
| scehr_preprocess_seconds | histogram | model |
| scehr_queue_seconds | histogram | model |
| scehr_compute_seconds | histogram | model |
| scehr_batch_size | histogram | model |
| scehr_validation_errors_total | counter | model, rule |
| scehr_warnings_total | counter | model, code |
| scehr_overload_rejections_total | counter | model |
| scehr_in_flight_requests | gauge | (none) |
| scehr_model_info | gauge (1 = serving) | task, name, version, provider |
| scehr_model_reloads_total | counter | model, outcome |
| scehr_default_model_since_timestamp_seconds | gauge (Unix time) | task, version |
| scehr_monitor_window_stays | gauge | model |
| scehr_monitor_observation_rate | gauge | model, variable |
| scehr_monitor_training_observation_rate | gauge | model, variable |
| scehr_monitor_value_psi | gauge | model, variable |
| scehr_monitor_mean_risk | gauge | model, label |
| scehr_monitor_risk_psi | gauge | model, label |
| scehr_monitor_alert_rate | gauge | model, label, operating_point |
| scehr_monitor_validation_alert_rate | gauge | model, label, operating_point |

The `scehr_monitor_*` gauges summarize the last N scored stays (SCEHR_MONITOR_WINDOW) against
the model's training and validation figures (service/monitoring.py, docs/monitoring.md); their
label values come from the model's manifest (variables, labels, operating points), never from a
request. In multiprocess mode they carry a `pid` label: each worker watches its own share.

`endpoint` is the route template (`/predict/{task}/batch`), `unmatched` for unknown paths;
`model` is a task of the contract, `unknown` for anything else (label values never come from
what a client sends, so the exposition stays bounded). When `PROMETHEUS_MULTIPROC_DIR` is set
(several uvicorn workers; `scehr serve` then creates a private one), values are written there by
every worker and `/metrics` aggregates them: counters and histograms are summed, the in-flight
gauge is summed over live workers, and `scehr_model_info` carries a `pid` label per worker, since
each worker holds its own sessions (a reload reaches one worker only). The live gauges of a
worker that died without shutting down (killed) are dropped at the next scrape.
`scehr_default_model_since_timestamp_seconds` is the index's default version of each served task
and when it became the default (0 when the index does not say).
"""

from __future__ import annotations

import contextlib
import os
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)

disable_created_metrics()  # `_created` series double the exposition for no use here

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def multiprocess_mode() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


#: The files prometheus_client writes in multiprocess mode: `<kind>_<pid>.db`.
METRIC_FILE = re.compile(r"^(counter|histogram|summary|gauge_[a-z]+)_(\d+)\.db$")
_LIVE_GAUGE = re.compile(r"^gauge_live[a-z]*_(\d+)\.db$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def drop_dead_workers(folder: str | Path) -> list[int]:
    """mark_process_dead for every pid with live-gauge files that no longer runs."""
    dead = set()
    for f in Path(folder).glob("gauge_live*.db"):
        m = _LIVE_GAUGE.match(f.name)
        if m and not _alive(int(m.group(1))):
            dead.add(int(m.group(1)))
    for pid in dead:
        multiprocess.mark_process_dead(pid, str(folder))
    return sorted(dead)


class Metrics:
    """All metric objects of one app; its own registry, so several apps never collide."""

    def __init__(self) -> None:
        self.multiprocess = multiprocess_mode()
        reg = None if self.multiprocess else CollectorRegistry()
        self._registry = reg
        self.requests = Counter("scehr_requests", "HTTP requests",
                                ["endpoint", "model", "status"], registry=reg)
        self.request_seconds = Histogram(
            "scehr_request_duration_seconds", "End-to-end request latency",
            ["endpoint", "model", "status"], buckets=LATENCY_BUCKETS, registry=reg)
        self.preprocess_seconds = Histogram(
            "scehr_preprocess_seconds", "Validation and tensorization time per request",
            ["model"], buckets=LATENCY_BUCKETS, registry=reg)
        self.queue_seconds = Histogram(
            "scehr_queue_seconds", "Time a request waited in the batcher queue", ["model"],
            buckets=LATENCY_BUCKETS, registry=reg)
        self.compute_seconds = Histogram(
            "scehr_compute_seconds", "ONNX Runtime time per batch", ["model"],
            buckets=LATENCY_BUCKETS, registry=reg)
        self.batch_size = Histogram("scehr_batch_size", "Rows per ONNX Runtime run", ["model"],
                                    buckets=BATCH_BUCKETS, registry=reg)
        self.validation_errors = Counter(
            "scehr_validation_errors", "Validation problems by rule", ["model", "rule"],
            registry=reg)
        self.warnings = Counter("scehr_warnings", "Input warnings by code", ["model", "code"],
                                registry=reg)
        self.overload = Counter("scehr_overload_rejections",
                                "Requests refused with 503 because the queue was full",
                                ["model"], registry=reg)
        self.in_flight = Gauge("scehr_in_flight_requests", "Requests being handled",
                               registry=reg, multiprocess_mode="livesum")
        self.model_info = Gauge("scehr_model_info", "Model served (1) with its provider",
                                ["task", "name", "version", "provider"], registry=reg,
                                multiprocess_mode="liveall")
        self._defaults: dict[str, str] = {}
        self.default_since = Gauge(
            "scehr_default_model_since_timestamp_seconds",
            "Default version of the task in index.json and since when (Unix time)",
            ["task", "version"], registry=reg, multiprocess_mode="mostrecent")
        self.reloads = Counter("scehr_model_reloads", "Admin reloads by outcome",
                               ["model", "outcome"], registry=reg)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

        def monitor(name: str, doc: str, labels: list[str]) -> Gauge:
            return Gauge(f"scehr_monitor_{name}", doc, ["model", *labels], registry=reg,
                         multiprocess_mode="liveall")

        self.monitor_stays = monitor("window_stays", "Scored stays in the monitoring window", [])
        self.monitor_observed = monitor(
            "observation_rate", "Share of window stays where the variable was observed",
            ["variable"])
        self.monitor_training_observed = monitor(
            "training_observation_rate", "Share of training stays where it was observed",
            ["variable"])
        self.monitor_value_psi = monitor(
            "value_psi", "Population-stability index of observed values vs training",
            ["variable"])
        self.monitor_mean_risk = monitor("mean_risk", "Mean served risk in the window",
                                         ["label"])
        self.monitor_risk_psi = monitor(
            "risk_psi", "Population-stability index of served risks vs validation", ["label"])
        self.monitor_alert_rate = monitor(
            "alert_rate", "Share of window stays alerted at the operating point",
            ["label", "operating_point"])
        self.monitor_validation_alert_rate = monitor(
            "validation_alert_rate", "The operating point's alert rate on validation",
            ["label", "operating_point"])

    def child(self, metric: Counter | Histogram, *values: str) -> Any:
        """`metric.labels(*values)`, memoized: per request the service counts a few label sets
        of closed value sets, and `labels()` (a lock, label checks) costs more than the count
        it precedes. Only for series never removed (not `model_info`, `default_since`)."""
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    def set_model(self, task: str, name: str, version: str, provider: str,
                  previous: tuple[str, str, str] | None = None) -> None:
        """Mark a model as served, and the one it replaced (name, version, provider) as not."""
        if previous is not None and previous != (name, version, provider):
            labels = (task, *previous)
            if self.multiprocess:
                self.model_info.labels(*labels).set(0)
            else:
                with contextlib.suppress(KeyError):
                    self.model_info.remove(*labels)
        self.model_info.labels(task, name, version, provider).set(1)

    def set_default(self, task: str, version: str, since: datetime | None) -> None:
        """The default version of a task (one series per task: labels stay bounded)."""
        prev = self._defaults.get(task)
        if prev is not None and prev != version and not self.multiprocess:
            with contextlib.suppress(KeyError):
                self.default_since.remove(task, prev)
        self._defaults[task] = version
        self.default_since.labels(task, version).set(since.timestamp() if since else 0.0)

    def render(self) -> tuple[bytes, str]:
        if self.multiprocess:
            drop_dead_workers(os.environ["PROMETHEUS_MULTIPROC_DIR"])
            reg = CollectorRegistry()
            multiprocess.MultiProcessCollector(reg)
            return generate_latest(reg), CONTENT_TYPE_LATEST
        assert self._registry is not None
        return generate_latest(self._registry), CONTENT_TYPE_LATEST

    @staticmethod
    def process_exit() -> None:
        """Drop this worker's live gauges from the multiprocess files."""
        if multiprocess_mode():
            multiprocess.mark_process_dead(os.getpid())
