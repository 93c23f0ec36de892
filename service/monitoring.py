"""Drift and quality monitoring of served inputs and outputs, per model, in fixed memory.

Each model has a window of its last N scored stays (a ring of fixed-size rows, N =
SCEHR_MONITOR_WINDOW): per stay, which variables were observed, its observed hourly values in
the manifest's fixed bins, its risk bin and its alert at every named operating point. Running
sums are updated as rows enter and leave, so a request costs O(variables x bins) and memory
never depends on traffic or on what clients send. Against the manifest:

- observation rate per variable vs `coverage` (share of training stays observing it);
- population-stability index (PSI) of observed values vs `value_reference` (training);
- served risk: mean and PSI vs the class's `risk_reference` (validation risks);
- alert rate per operating point vs its validation alert rate.

Gauges (service/metrics.py) are refreshed at most once a second while traffic flows, and on
every scrape or summary. Manifests without a value or risk reference (contract 1.0) get the
figures that need none; the summary's notes say what is missing.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass

import numpy as np

from scehr.schemas.payloads import AlertDrift, MonitoringSummary, RiskDrift, VariableDrift
from scehr.schemas.profile import Bins, bin_index, psi
from scehr.service.metrics import Metrics
from scehr.service.model import ModelSpec

#: Stays the window needs before a PSI is reported (fewer give noise, not drift).
MIN_STAYS_FOR_PSI = 50
#: Observed hourly values a variable needs in the window before its PSI is reported.
MIN_VALUES_FOR_PSI = 100
REFRESH_SECONDS = 1.0
#: Rows `ModelMonitor.observe` queues before they enter the window in one update.
PENDING_ROWS = 32


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
    """The queued stays' arrays as one."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _joined_values(parts: list[tuple[np.ndarray, np.ndarray | None]],
                   shape: tuple[int, ...]) -> np.ndarray | None:
    """The queued stays' value counts as one array of rows of `shape` (None when no queued
    stay has any). A request may bring none (raw tensors: values cannot be binned once
    normalized) while the one queued beside it has them: its stays then count no value,
    as each would have entering the window alone."""
    if all(values is None for _, values in parts):
        return None
    return _joined([np.zeros((observed.shape[0], *shape), dtype=np.int32) if values is None
                    else values for observed, values in parts])


@dataclass(frozen=True)
class Reference:
    """What one model's monitor compares against, from its manifest."""

    task: str
    version: str
    variables: tuple[str, ...]
    coverage: np.ndarray  # [V], NaN where unknown
    bins: Bins | None  # value bins, None without a value reference
    value_fractions: np.ndarray | None  # [V, width], NaN rows where a variable has none
    n_value_bins: np.ndarray  # [V]
    labels: tuple[str, ...]
    risk_edges: list[np.ndarray | None]  # per class
    risk_fractions: list[np.ndarray | None]
    points: tuple[str, ...]
    validation_alert_rate: np.ndarray  # [P, C]


class ModelMonitor:
    """The sliding window of one model; thread-safe."""

    def __init__(self, ref: Reference, window: int, metrics: Metrics | None = None) -> None:
        self.ref, self.size, self.metrics = ref, window, metrics
        v, c, p = len(ref.variables), len(ref.labels), len(ref.points)
        width = ref.bins.width if ref.bins is not None else 1
        r_width = max([len(e) + 1 for e in ref.risk_edges if e is not None], default=1)
        self._observed = np.zeros((window, v), dtype=bool)
        self._values = np.zeros((window, v, width), dtype=np.int32)
        self._risk = np.zeros((window, c), dtype=np.float64)
        self._risk_bin = np.zeros((window, c), dtype=np.int64)
        self._alerts = np.zeros((window, c, p), dtype=bool)
        self._sum_observed = np.zeros(v, dtype=np.int64)
        self._sum_values = np.zeros((v, width), dtype=np.int64)
        self._sum_risk = np.zeros(c, dtype=np.float64)
        self._sum_risk_bins = np.zeros((c, r_width), dtype=np.int64)
        self._sum_alerts = np.zeros((c, p), dtype=np.int64)
        self._next = 0
        self._count = 0
        self._lock = threading.Lock()
        self._refreshed = 0.0
        #: The last `window` answered stays: whether each abstained (a ring of its own: the
        #: drift window holds scored stays only).
        self._abstained = np.zeros(window, dtype=bool)
        self._answers_next = 0
        self._answers = 0
        #: Stays observed but not yet in the window (`observe`), and their rows.
        self._pending: list[tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]] = []
        self._pending_rows = 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the window (fixed at construction)."""
        return sum(a.nbytes for a in (self._observed, self._values, self._risk, self._risk_bin,
                                      self._alerts, self._sum_observed, self._sum_values,
                                      self._sum_risk, self._sum_risk_bins, self._sum_alerts))

    def risk_bins(self, risk: np.ndarray) -> np.ndarray:
        out = np.zeros(risk.shape, dtype=np.int64)
        for c, edges in enumerate(self.ref.risk_edges):
            if edges is not None:
                out[:, c] = bin_index(risk[:, c], edges)
        return out

    def answered(self, abstained: np.ndarray) -> None:
        """Count answered stays (True: below the data minimum, no risk), the oldest leaving
        once `size` are held."""
        abstained = np.asarray(abstained, dtype=bool)[-self.size:]
        n = abstained.shape[0]
        if n == 0:
            return
        with self._lock:
            idx = (self._answers_next + np.arange(n)) % self.size
            self._abstained[idx] = abstained
            self._answers_next = int((self._answers_next + n) % self.size)
            self._answers = min(self.size, self._answers + n)

    def observe(self, observed: np.ndarray, values: np.ndarray | None, risk: np.ndarray,
                alerts: np.ndarray) -> None:
        """Add stays: observed [n, V], value counts [n, V, width] (or None), risk [n, C],
        alerts [n, C, P]; the oldest leave once the window is full.

        The stays wait in a short queue (at most PENDING_ROWS rows) and enter the window
        together: the window's numpy updates cost about the same for one stay as for a few
        dozen. Every reading (`summary`, the gauges) lets the queue in first."""
        n = observed.shape[0]
        if n == 0:
            return
        with self._lock:
            self._pending.append((observed, values, risk, alerts))
            self._pending_rows += n
            if self._pending_rows >= PENDING_ROWS:
                self._enter()
        if time.monotonic() - self._refreshed >= REFRESH_SECONDS:
            self.refresh_gauges()

    def _enter(self) -> None:
        """Move the queued stays into the window, oldest first (call with the lock held)."""
        parts, self._pending, self._pending_rows = self._pending, [], 0
        if not parts:
            return
        observed, risk, alerts = (_joined([p[k] for p in parts]) for k in (0, 2, 3))
        values = _joined_values([(p[0], p[1]) for p in parts], self._values.shape[1:])
        n = observed.shape[0]
        if n > self.size:  # only the newest `size` stays can be in the window
            observed, risk, alerts = observed[-self.size:], risk[-self.size:], alerts[-self.size:]
            values = None if values is None else values[-self.size:]
            n = self.size
        idx = (self._next + np.arange(n)) % self.size
        old = idx[idx < self._count] if self._count < self.size else idx
        self._add(old, -1)
        self._observed[idx] = observed
        self._values[idx] = 0 if values is None else values
        self._risk[idx] = risk
        self._risk_bin[idx] = self.risk_bins(risk)
        self._alerts[idx] = alerts
        self._add(idx, +1)
        self._next = int((self._next + n) % self.size)
        self._count = min(self.size, self._count + n)

    def _add(self, idx: np.ndarray, sign: int) -> None:
        if idx.size == 0:
            return
        self._sum_observed += sign * self._observed[idx].sum(axis=0)
        self._sum_values += sign * self._values[idx].sum(axis=0)
        self._sum_risk += sign * self._risk[idx].sum(axis=0)
        self._sum_alerts += sign * self._alerts[idx].sum(axis=0)
        c_n = self._risk_bin.shape[1]
        for c in range(c_n):
            self._sum_risk_bins[c] += sign * np.bincount(
                self._risk_bin[idx, c], minlength=self._sum_risk_bins.shape[1])

    def summary(self) -> MonitoringSummary:
        ref = self.ref
        with self._lock:
            self._enter()
            n = self._count
            obs, vals = self._sum_observed.copy(), self._sum_values.copy()
            risk_sum, rbins = self._sum_risk.copy(), self._sum_risk_bins.copy()
            alerts = self._sum_alerts.copy()
            answers = self._answers
            abstained = int(self._abstained[:answers].sum())

        def rate(x: float) -> float | None:
            return x / n if n else None

        enough = n >= MIN_STAYS_FOR_PSI
        variables = []
        for k, vid in enumerate(ref.variables):
            hours = int(vals[k, : ref.n_value_bins[k]].sum())
            value_psi = None
            if (enough and hours >= MIN_VALUES_FOR_PSI and ref.value_fractions is not None
                    and not np.isnan(ref.value_fractions[k, 0])):
                nb = ref.n_value_bins[k]
                value_psi = psi(ref.value_fractions[k, :nb], vals[k, :nb])
            cov = ref.coverage[k]
            variables.append(VariableDrift(
                variable=vid, observation_rate=rate(float(obs[k])),
                training_observation_rate=None if math.isnan(cov) else float(cov),
                psi=value_psi, observed_hours=hours))
        risks = []
        for c, label in enumerate(ref.labels):
            frac = ref.risk_fractions[c]
            risk_psi = (psi(frac, rbins[c, : len(frac)]) if enough and frac is not None
                        else None)
            risks.append(RiskDrift(label=label, mean_risk=rate(float(risk_sum[c])),
                                   psi=risk_psi))
        rows = []
        for c, label in enumerate(ref.labels):
            for k, point in enumerate(ref.points):
                expected = ref.validation_alert_rate[k, c]
                if math.isnan(expected) and ref.points != ("high_sensitivity",):
                    continue  # this class has no such point
                rows.append(AlertDrift(
                    label=label, operating_point=point, alert_rate=rate(float(alerts[c, k])),
                    validation_alert_rate=None if math.isnan(expected) else float(expected)))
        notes = []
        if ref.bins is None:
            notes.append("value PSI unavailable: the manifest has no value_reference "
                         "(exported before contract 1.1); observation rates are monitored")
        if all(f is None for f in ref.risk_fractions):
            notes.append("risk PSI unavailable: the manifest has no risk_reference "
                         "(exported before contract 1.1); mean risk and alert rates are "
                         "monitored")
        return MonitoringSummary(
            task=ref.task, model_version=ref.version, window_size=self.size, stays=n,
            min_stays_for_psi=MIN_STAYS_FOR_PSI, variables=variables, risk=risks,
            alerts=rows, answered=answers,
            abstention_rate=abstained / answers if answers else None, notes=notes,
            worker_pid=os.getpid())

    def refresh_gauges(self) -> MonitoringSummary:
        s = self.summary()
        self._refreshed = time.monotonic()
        m = self.metrics
        if m is None:
            return s
        task = self.ref.task

        def num(x: float | None) -> float:
            return math.nan if x is None else x

        m.monitor_stays.labels(task).set(s.stays)
        for v in s.variables:
            m.monitor_observed.labels(task, v.variable).set(num(v.observation_rate))
            m.monitor_training_observed.labels(task, v.variable).set(
                num(v.training_observation_rate))
            m.monitor_value_psi.labels(task, v.variable).set(num(v.psi))
        for r in s.risk:
            m.monitor_mean_risk.labels(task, r.label).set(num(r.mean_risk))
            m.monitor_risk_psi.labels(task, r.label).set(num(r.psi))
        for a in s.alerts:
            m.monitor_alert_rate.labels(task, a.label, a.operating_point).set(
                num(a.alert_rate))
            m.monitor_validation_alert_rate.labels(task, a.label, a.operating_point).set(
                num(a.validation_alert_rate))
        return s


def reference_of(spec: ModelSpec) -> Reference:
    """The monitor's baseline from a model's manifest."""
    m, fs = spec.manifest, spec.fs
    v_n = fs.n_channels
    coverage = np.array([m.coverage.get(v, math.nan) for v in fs.variable_ids], dtype=np.float64)
    fractions = None
    n_bins = np.ones(v_n, dtype=np.int64)
    if spec.bins is not None:
        fractions = np.full((v_n, spec.bins.width), math.nan)
        for k, vid in enumerate(fs.variable_ids):
            n_bins[k] = spec.bins.n_bins(fs, k)
            h = m.value_reference.get(vid)
            if h is not None and len(h.fractions) == n_bins[k]:
                fractions[k, : n_bins[k]] = h.fractions
    edges: list[np.ndarray | None] = []
    risk_fractions: list[np.ndarray | None] = []
    for card in m.classes:
        h = card.risk_reference
        edges.append(None if h is None else np.asarray(h.edges, dtype=np.float64))
        risk_fractions.append(None if h is None else np.asarray(h.fractions))
    pts = spec.points
    return Reference(m.task, m.version, fs.variable_ids, coverage, spec.bins, fractions,
                     n_bins, tuple(m.label_names), edges, risk_fractions, pts.names,
                     pts.validation_alert_rate)


class Monitoring:
    """One monitor per served model version; a model with another checksum starts afresh.

    The gauges (labelled by task) show the task's default version; every version's summary
    is at GET /models/{task}/monitoring?version=."""

    def __init__(self, metrics: Metrics | None, window: int) -> None:
        self.metrics, self.window = metrics, window
        self._monitors: dict[tuple[str, str], tuple[str, ModelMonitor]] = {}
        self._lock = threading.Lock()

    def for_spec(self, spec: ModelSpec, *, gauges: bool = True) -> ModelMonitor:
        """The monitor of the model `spec` describes (created on first use); `gauges`: it
        is the task's default version, whose monitor feeds the gauges."""
        key = (spec.task, spec.manifest.version)
        with self._lock:
            cur = self._monitors.get(key)
            if cur is not None and cur[0] == spec.ref.sha256:
                mon = cur[1]
            else:
                mon = ModelMonitor(reference_of(spec), self.window, None)
                self._monitors[key] = (spec.ref.sha256, mon)
            if gauges and mon.metrics is None:  # the task's default changed to this version
                for (task, _), (_, other) in self._monitors.items():
                    if task == spec.task:
                        other.metrics = None
                mon.metrics = self.metrics
            elif not gauges:
                mon.metrics = None
            return mon

    def monitors(self) -> list[ModelMonitor]:
        with self._lock:
            return [m for _, m in self._monitors.values()]

    def refresh_all(self) -> None:
        for m in self.monitors():
            m.refresh_gauges()
