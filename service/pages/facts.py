"""The model-facts page of one served version: every figure read from its manifest.

Nothing here is measured or recomputed: a figure the manifest lacks is said to be missing.
The page is rendered once per model (name, version, checksum) and kept
(`FactsCache`), so it costs a dictionary look-up after the first request.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from markupsafe import Markup

from scehr.schemas import transparency
from scehr.schemas.manifest import ClassCard, Manifest
from scehr.schemas.site import PARENT_KEY, site_record
from scehr.schemas.tasks import task_spec
from scehr.service.pages.svg import PALETTE, Axes, Mark, Series, line_chart, nice_ticks

#: Classes a page shows in full (the phenotype model has 25; the rest are in the card).
MAX_CLASSES = 25
#: Rendered facts pages kept (versions served at once are few; the oldest leaves first).
CACHE_SIZE = 32


@dataclass
class Figure:
    """A metric with its 95% interval, as the manifest holds it."""

    name: str
    value: float | None
    low: float | None = None
    high: float | None = None
    note: str = ""


@dataclass
class ClassFacts:
    label: str
    calibration: dict[str, Any]
    points: list[dict[str, Any]]
    withheld: list[dict[str, str]]
    curve: Markup | None
    coverage: list[dict[str, Any]]
    level: float | None


#: The statuses of an HTI-1 attribute or a TRIPOD+AI item, in the order the page counts them.
STATUS_ORDER = (transparency.ANSWERED, transparency.REPORTED, transparency.PARTLY,
                transparency.NOT_APPLICABLE, transparency.NOT_REPORTED)


@dataclass
class Transparency:
    """The HTI-1 source attributes as the transparency route serves them, and the TRIPOD+AI
    checklist's counts by status: built by the route's own functions, so the two never
    differ."""

    attributes: list[dict[str, Any]]
    attribute_counts: list[tuple[str, int]]
    tripod_counts: list[tuple[str, int]]
    tripod_items: int


def status_counts(statuses: list[str]) -> list[tuple[str, int]]:
    """(status, how many) in `STATUS_ORDER`, the statuses present only."""
    return [(s, statuses.count(s)) for s in STATUS_ORDER if s in statuses]


def transparency_facts(m: Manifest) -> Transparency:
    attributes = transparency.hti1(m)["attributes"]
    items = transparency.tripod_ai(m)["items"]
    return Transparency(attributes=attributes,
                        attribute_counts=status_counts([a["status"] for a in attributes]),
                        tripod_counts=status_counts([i["status"] for i in items]),
                        tripod_items=len(items))


@dataclass
class Facts:
    """What the facts template shows."""

    manifest: Manifest
    sha256: str
    default: bool
    description: str
    performance: list[Figure]
    val_figures: dict[str, Any]
    test_figures: dict[str, Any]
    site: Any
    calibration_plot: Markup | None
    fairness: dict[str, Any] | None
    subgroups: dict[str, Any] | None
    classes: list[ClassFacts]
    hidden_classes: int
    minimum: Any
    limitations: list[str]
    transparency: Transparency
    never_observed: list[str] = field(default_factory=list)


def _ci(raw: Any) -> tuple[float | None, float | None, float | None]:
    if isinstance(raw, dict):
        return raw.get("value"), raw.get("low"), raw.get("high")
    return (raw if isinstance(raw, int | float) else None), None, None


def own_metrics(m: Manifest) -> dict[str, Any]:
    """The test figures the model card leads with: a site model's parent's own (kept in
    `metrics.parent`, its site figures apart in `metrics.site`), else the model's."""
    parent = m.metrics.get(PARENT_KEY)
    return parent if isinstance(parent, dict) else m.metrics


def performance(metrics: dict[str, Any]) -> list[Figure]:
    """The test metrics with their bootstrap CIs (`test_ci`), then the other scalar test
    figures (`test`) without one."""
    out = []
    cis = metrics.get("test_ci") or {}
    for name, raw in cis.items():
        value, low, high = _ci(raw)
        note = ""
        if isinstance(raw, dict) and raw.get("n_boot"):
            note = f"{raw.get('n_valid', raw['n_boot'])} of {raw['n_boot']} resamples"
        out.append(Figure(name, value, low, high, note))
    test = metrics.get("test") or {}
    for name, raw in test.items():
        if name not in cis and isinstance(raw, int | float) and not isinstance(raw, bool):
            out.append(Figure(name, float(raw)))
    return out


def logistic_curve(slope: float, intercept: float, n: int = 41) -> list[tuple[float, float]]:
    """Observed risk as the fitted calibration line says it: σ(intercept + slope·logit(p))."""
    pts = []
    for k in range(1, n):
        p = k / n
        z = intercept + slope * math.log(p / (1 - p))
        pts.append((p, 1 / (1 + math.exp(-z))))
    return pts


def calibration_plot(metrics: dict[str, Any]) -> Markup | None:
    """The calibration of the served risk per group, from the fairness audit's calibration
    slope and intercept on the test split (`fairness.groups`)."""
    groups = ((metrics.get("fairness") or {}).get("groups") or {})
    usable = {g: r for g, r in groups.items() if r.get("calibration_slope") is not None
              and r.get("calibration_intercept") is not None}
    if not usable:
        return None
    series = [Series("ideal", [(0.0, 0.0), (1.0, 1.0)], "#4d4d4d", dashed=True)]
    for k, (g, r) in enumerate(list(usable.items())[:5]):
        series.append(Series(f"{g}: slope {r['calibration_slope']:.2f}, intercept "
                             f"{r['calibration_intercept']:.2f}",
                             logistic_curve(r["calibration_slope"], r["calibration_intercept"]),
                             PALETTE[k % len(PALETTE)]))
    ticks = [0, 0.25, 0.5, 0.75, 1.0]
    ax = Axes(0, 1, 0, 1, width=460, height=320, x_ticks=ticks, y_ticks=ticks,
              x_label="risk shown", y_label="observed outcome rate (fitted)")
    data = (metrics.get("fairness") or {}).get("data", "the test split")
    return line_chart("calibration", "Calibration of the risk, by group",
                      f"Logistic calibration lines on {data}: " + "; ".join(
                          s.name for s in series[1:]) + ". The dashed diagonal is perfect "
                      "calibration.", ax, series)


def _point_row(p: Any) -> dict[str, Any]:
    return {"name": p.name, "rule": p.rule, "threshold": p.threshold,
            "validation": p.validation.model_dump(), "test": p.test and p.test.model_dump()}


def operating_curve(c: ClassCard, ident: str) -> Markup | None:
    """Sensitivity and PPV against the alert rate over the validation threshold table
    (`operating_points`), with the named points where their validation figures put them."""
    table = sorted(c.operating_points, key=lambda p: p.alert_rate)
    if len(table) < 2:
        return None
    se = Series("sensitivity", [(p.alert_rate, p.sensitivity) for p in table], PALETTE[0],
                marker=True)
    ppv = Series("PPV", [(p.alert_rate, p.ppv) for p in table], PALETTE[2], dashed=True,
                 marker=True)
    marks = []
    for p in c.named_points:
        v = p.validation
        if v.sensitivity is not None:
            marks.append(Mark(v.alert_rate, v.sensitivity, f"{p.name}: alert rate "
                              f"{v.alert_rate:.3f}, sensitivity {v.sensitivity:.3f}",
                              PALETTE[1]))
        if v.ppv is not None:
            marks.append(Mark(v.alert_rate, v.ppv, f"{p.name}: alert rate {v.alert_rate:.3f}, "
                              f"PPV {v.ppv:.3f}", PALETTE[1], "triangle"))
    top = max(1.0, max(p.alert_rate for p in table))
    ax = Axes(0, top, 0, 1, width=460, height=300, x_ticks=nice_ticks(0, top),
              y_ticks=[0, 0.25, 0.5, 0.75, 1.0], x_label="alert rate (validation)",
              y_label="sensitivity, PPV")
    names = ", ".join(p.name for p in c.named_points) or "none"
    return line_chart(ident, f"Operating points of {c.label}",
                      f"Sensitivity and PPV against the share of stays alerted, over "
                      f"{len(table)} validation thresholds; named points ({names}) in red.",
                      ax, [se, ppv], marks)


def class_facts(c: ClassCard, k: int) -> ClassFacts:
    u = c.uncertainty
    coverage = [] if u is None else [
        {"split": s.split, "n": s.n, "coverage": s.coverage,
         "with": s.coverage_with_outcome, "without": s.coverage_without_outcome,
         "single": s.single_outcome, "width": s.mean_width}
        for s in (u.validation, u.test) if s is not None]
    return ClassFacts(
        label=c.label, calibration=c.calibration.model_dump(exclude={"x", "y"}),
        points=[_point_row(p) for p in c.named_points],
        withheld=[w.model_dump() for w in c.withheld_points],
        curve=operating_curve(c, f"points-{k}"), coverage=coverage,
        level=None if u is None else u.level)


def limitations(m: Manifest) -> list[str]:
    out = [n for n in m.notes if "clinical use" in n]
    rare = m.metrics.get("too_rare_to_evaluate")
    if rare:
        out.append("Too rare on the test split to evaluate: " + ", ".join(rare) + ".")
    out.append(f"Trained and tested on {m.provenance.dataset}; figures at another hospital "
               "may differ (a site model, `scehr recalibrate`, measures them there).")
    return out


def build_facts(m: Manifest, sha256: str, default: bool) -> Facts:
    """The facts of a manifest, as the template shows them."""
    cards = m.classes[:MAX_CLASSES]
    metrics = own_metrics(m)
    fairness = metrics.get("fairness")
    return Facts(
        manifest=m, sha256=sha256, default=default,
        description=task_spec(m.task).description,
        performance=performance(metrics),
        val_figures={k: v for k, v in (metrics.get("val") or {}).items()
                     if isinstance(v, int | float) and not isinstance(v, bool)},
        test_figures=metrics.get("test") or {},
        site=site_record(m.metrics), calibration_plot=calibration_plot(metrics),
        fairness=fairness if isinstance(fairness, dict) else None,
        subgroups=metrics.get("subgroups"),
        classes=[class_facts(c, k) for k, c in enumerate(cards)],
        hidden_classes=len(m.classes) - len(cards), minimum=m.data_minimum,
        limitations=limitations(m), transparency=transparency_facts(m),
        never_observed=sorted(v for v, rate in m.coverage.items() if rate == 0.0))


class FactsCache:
    """Rendered facts pages by (task, version, checksum, default, options); bounded."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self._pages: OrderedDict[tuple[Any, ...], str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, ...], render: Callable[[], str]) -> str:
        with self._lock:
            page = self._pages.get(key)
            if page is not None:
                self._pages.move_to_end(key)
                return page
        page = render()
        with self._lock:
            self._pages[key] = page
            while len(self._pages) > self.size:
                self._pages.popitem(last=False)
        return page
