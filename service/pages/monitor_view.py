"""The monitoring page's figures: the service's own monitor, and latency from its metrics.

Drift, alert and abstention rates are the summaries `GET /models/{task}/monitoring` returns
(this worker's window). Latency percentiles are read from the request-duration histogram the
metrics exposition holds (every worker's, in multiprocess mode), interpolated within buckets
as Prometheus' `histogram_quantile` does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup
from prometheus_client.parser import text_string_to_metric_families

from scehr.schemas.payloads import MonitoringSummary
from scehr.service.auth import route_needs_key
from scehr.service.metrics import Metrics
from scehr.service.pages.svg import bar_chart

LATENCY_METRIC = "scehr_request_duration_seconds"
QUANTILES = (0.5, 0.9, 0.99)
#: PSI above which a variable's distribution is usually called shifted.
PSI_SHIFT = 0.25


@dataclass
class Latency:
    """Percentiles (seconds) of the successful scoring requests of one task."""

    task: str
    requests: int
    quantiles: dict[float, float | None]


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The q-quantile of cumulative buckets [(upper bound, count)], linear within a bucket
    (None without observations; the largest finite bound when it falls in +Inf)."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def scoring_endpoints(routes: Iterable[Any]) -> frozenset[str]:
    """The templates of the scoring routes: those that declare the API key, less admin."""
    return frozenset(r.path for r in routes
                     if route_needs_key(r) and not r.path.startswith("/admin/"))


def latencies(metrics: Metrics, tasks: list[str], endpoints: frozenset[str]) -> list[Latency]:
    """Per task: percentiles of its 2xx requests to `endpoints` (the scoring routes,
    together)."""
    text = metrics.render()[0].decode()
    per_task: dict[str, dict[float, float]] = {t: {} for t in tasks}
    for family in text_string_to_metric_families(text):
        if family.name != LATENCY_METRIC:
            continue
        for s in family.samples:
            task = s.labels.get("model")
            if (not s.name.endswith("_bucket") or task not in per_task
                    or s.labels.get("endpoint") not in endpoints
                    or not s.labels.get("status", "").startswith("2")):
                continue
            bound = float(s.labels["le"])
            per_task[task][bound] = per_task[task].get(bound, 0.0) + s.value
    out = []
    for task, counts in per_task.items():
        buckets = sorted(counts.items())
        n = int(buckets[-1][1]) if buckets else 0
        out.append(Latency(task, n, {q: histogram_quantile(q, buckets) for q in QUANTILES}))
    return out


def drift_chart(s: MonitoringSummary, ident: str) -> Markup | None:
    """PSI per variable of the window's observed values against training."""
    rows = [(v.variable, v.psi) for v in s.variables if v.psi is not None]
    if not rows:
        return None
    return bar_chart(ident, f"Input drift of {s.task} {s.model_version}",
                     f"Population-stability index of each variable's observed values in the "
                     f"last {s.stays} stays against training (above {PSI_SHIFT} is usually "
                     "called a shift): " + "; ".join(f"{v} {p:.3f}" for v, p in rows),
                     [(v, p) for v, p in rows], unit="PSI", signed=False)


def observation_chart(s: MonitoringSummary, ident: str) -> Markup | None:
    """Observation rate per variable, with the training rate as a tick."""
    rows = [v for v in s.variables if v.observation_rate is not None]
    if not rows:
        return None
    return bar_chart(ident, f"How often each variable is observed ({s.task})",
                     "Share of the window's stays observing each variable (bar) and of "
                     "training stays (tick)",
                     [(v.variable, v.observation_rate or 0.0) for v in rows],
                     unit="share of stays", signed=False,
                     reference=[v.training_observation_rate for v in rows])
