"""How an exported model does on a site's stays, read the way the service serves them:
`scehr evaluate MODEL_DIR --data DIR` and the report `scehr recalibrate` writes.

Every stay is scored by the service's own offline path (`scehr score`, through
`scehr.training.served_scores`), so a stay below the model's data minimum abstains here
exactly as it does in service, and the risk, outcome set and alert are the served ones. The
report gives, with 95 % percentile bootstrap CIs over stays (`scehr.training.bootstrap`):

- abstention: the share of stays below the data minimum and the service's reasons;
- discrimination and calibration (AUROC, AUPRC, ECE, calibration slope and intercept, the
  Challenge 2012 scores) on the scored stays and on all stays with the minimum lifted, side
  by side; a slope or intercept that cannot be estimated is a warning, never a number
  (`scehr.training.fairness.calibration_fit`);
- the coverage of the served outcome sets, overall and per outcome, and by risk decile;
- alert rate, sensitivity and PPV at every named operating point (withheld points with their
  reason);
- the fairness audit by sex and age band on the scored stays.

With `compare`, a second model (e.g. the site model recalibrated from the first) is scored on
the same stays and reported beside it. `write_report` also writes report.json, a
self-contained report.html (`scehr.training.report_html`) and the figures as PNG files.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scehr.schemas.featureset import FeatureSet
from scehr.schemas.manifest import ClassCard, Manifest, load_manifest
from scehr.schemas.tasks import task_spec
from scehr.training import fairness
from scehr.training.risk_figures import Metric, figure_ci, risk_figures
from scehr.training.served_scores import ALL_SPLITS, ServedScores, served_scores

#: `--split` choices: every split of the dataset, or one.
SPLIT_CHOICES = ("all", *ALL_SPLITS)
#: Risk groups of the reliability diagram (equal-count), and the fewest stays per group.
RELIABILITY_GROUPS = 10
MIN_GROUP = 30
#: The folder of a site model that holds its report against its parent (`scehr recalibrate`).
REPORT_FOLDER = "report"
#: What the report calls each model it holds, in the order shown.
ROLES = ("model", "compare")


@dataclass
class Evaluated:
    """One model's served answers on the evaluated stays."""

    folder: Path
    manifest: Manifest
    served: ServedScores  # as served: abstentions below the data minimum
    lifted: ServedScores  # with the minimum lifted
    sex_flipped: ServedScores | None = None  # lifted, only the recorded sex flipped

    @property
    def card(self) -> ClassCard:
        return self.manifest.classes[0]

    @property
    def name(self) -> str:
        return f"{self.manifest.task} {self.manifest.version}"


# ---------------------------------------------------------------- figures


def _mean(_: np.ndarray, a: np.ndarray) -> float:
    return float(np.mean(a)) if len(a) else float("nan")


def _sensitivity(y: np.ndarray, a: np.ndarray) -> float:
    pos = y > 0.5
    return float(np.mean(a[pos] > 0.5)) if pos.any() else float("nan")


def _ppv(y: np.ndarray, a: np.ndarray) -> float:
    alert = a > 0.5
    return float(np.mean(y[alert] > 0.5)) if alert.any() else float("nan")


def _among(outcome: bool) -> Metric:
    def share(y: np.ndarray, hit: np.ndarray) -> float:
        m = (y > 0.5) == outcome
        return float(np.mean(hit[m])) if m.any() else float("nan")
    return share


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion k / n."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return float(max(0.0, c - h)), float(min(1.0, c + h))


def reliability_rows(y: np.ndarray, risk: np.ndarray) -> list[dict[str, Any]]:
    """Equal-count risk groups: mean risk, observed rate and its Wilson interval."""
    groups = min(RELIABILITY_GROUPS, len(y) // MIN_GROUP)
    if groups < 2:
        return []
    rows = []
    for idx in np.array_split(np.argsort(risk, kind="stable"), groups):
        k, n = int(y[idx].sum()), len(idx)
        lo, hi = wilson(k, n)
        rows.append({"n": n, "events": k, "mean_risk": float(risk[idx].mean()),
                     "observed_rate": k / n, "low": lo, "high": hi})
    return rows


def coverage_figures(s: ServedScores, card: ClassCard, n_boot: int, seed: int
                     ) -> dict[str, Any] | None:
    """Coverage of the served outcome sets (None: the model serves no interval)."""
    u = card.uncertainty
    if u is None or not s.has_interval or not len(s.y):
        return None
    hit = np.where(s.y > 0.5, s.in_set[:, 1], s.in_set[:, 0]).astype(np.float64)
    deciles = []
    for d, idx in enumerate(np.array_split(np.argsort(s.risk, kind="stable"), 10), start=1):
        if not len(idx):
            continue
        pos = s.y[idx] > 0.5
        deciles.append({"decile": d, "n": len(idx), "events": int(pos.sum()),
                        "risk_low": float(s.risk[idx].min()),
                        "risk_high": float(s.risk[idx].max()),
                        "coverage": float(hit[idx].mean()),
                        "coverage_with_outcome": float(hit[idx][pos].mean()) if pos.any()
                        else None})
    validation = u.validation.coverage if u.validation is not None else None
    return {"level": u.level, "validation_coverage": validation,
            "overall": figure_ci(_mean, s.y, hit, n_boot, seed),
            "with_outcome": figure_ci(_among(True), s.y, hit, n_boot, seed),
            "without_outcome": figure_ci(_among(False), s.y, hit, n_boot, seed),
            "single_outcome_share": float((s.in_set[:, 0] != s.in_set[:, 1]).mean()),
            "by_decile": deciles}


def point_rows(s: ServedScores, card: ClassCard, n_boot: int, seed: int
               ) -> list[dict[str, Any]]:
    """Alert rate, sensitivity and PPV at every named point (alert: risk >= threshold, as the
    service's named points; a contract-1.0 model's one point is read from the served alert)."""
    points: list[tuple[str, float | None, str, np.ndarray, Any]] = [
        (p.name, p.threshold, p.rule, s.risk >= p.threshold, p.validation)
        for p in card.named_points]
    if not points:
        points = [("default", None, f"the model's default alert (contract 1.0: score >= "
                   f"{card.default_threshold:.4f})", s.alert, None)]
    rows = []
    for name, threshold, rule, alerts, val in points:
        a = alerts.astype(np.float64)
        rows.append({
            "name": name, "threshold": threshold, "rule": rule,
            "default": name == (card.default_operating_point or "default"),
            "alerts": int(alerts.sum()),
            "alert_rate": figure_ci(_mean, s.y, a, n_boot, seed),
            "sensitivity": figure_ci(_sensitivity, s.y, a, n_boot, seed),
            "ppv": figure_ci(_ppv, s.y, a, n_boot, seed),
            "validation": None if val is None else {
                "alert_rate": val.alert_rate, "sensitivity": val.sensitivity, "ppv": val.ppv}})
    return rows


def population(s: ServedScores, card: ClassCard, n_boot: int, seed: int) -> dict[str, Any]:
    """Every figure of one set of scored stays."""
    return {"metrics": risk_figures(s.y, s.risk, n_boot, seed),
            "coverage": coverage_figures(s, card, n_boot, seed),
            "operating_points": point_rows(s, card, n_boot, seed) if len(s.y) else [],
            "reliability": reliability_rows(s.y, s.risk)}


def reason_kind(message: str) -> str:
    """A service reason with this stay's own numbers taken out, so that stays falling short of
    the same bound count together: "14 variable(s) observed ...; this model needs at least 20
    different ones" -> "N variable(s) observed ...; this model needs at least 20 ..."."""
    measured, _, bound = message.partition("; ")
    return re.sub(r"\d+(\.\d+)?", "N", measured) + ("; " + bound if bound else "")


def abstention(ev: Evaluated, n_boot: int, seed: int) -> dict[str, Any]:
    """How many stays the service refuses to score for too little data, and why."""
    s, minimum = ev.served, ev.manifest.data_minimum
    gone = s.abstained
    scored = s.status == "ok"
    kinds = Counter(k for i in np.flatnonzero(gone) for k in
                    dict.fromkeys(reason_kind(r) for r in s.reasons[i]))
    out: dict[str, Any] = {
        "data_minimum": None if minimum is None
        else minimum.model_dump(exclude={"validation", "test"}),
        "n": len(s.y), "abstained": int(gone.sum()), "scored": int(scored.sum()),
        "errors": int(s.errors.sum()),
        "rate": figure_ci(_mean, s.y, gone.astype(np.float64), n_boot, seed) if len(s.y) else None,
        "outcome_rate_scored": float(s.y[scored].mean()) if scored.any() else None,
        "outcome_rate_abstained": float(s.y[gone].mean()) if gone.any() else None,
        "reasons": [{"reason": k, "stays": c} for k, c in kinds.most_common()],
    }
    if minimum is not None and minimum.test is not None and minimum.test.n:
        out["rate_on_the_models_test_set"] = 1 - minimum.test.kept / minimum.test.n
    return out


def model_block(ev: Evaluated, n_boot: int, seed: int) -> dict[str, Any]:
    """One model's report: abstention, then its figures as served and with the minimum
    lifted (stays whose rows are errors are in neither)."""
    m, card = ev.manifest, ev.card
    print(f"scehr evaluate: bootstrap ({n_boot} resamples) of {ev.name} on "
          f"{len(ev.served.y)} stays", file=sys.stderr, flush=True)
    return {
        "model": {"folder": str(ev.folder), "name": m.name, "version": m.version,
                  "task": m.task, "label": card.label, "calibration": card.calibration.method,
                  "interval_level": None if card.uncertainty is None
                  else card.uncertainty.level,
                  "default_operating_point": card.default_operating_point,
                  "withheld_points": [w.model_dump() for w in card.withheld_points]},
        "abstention": abstention(ev, n_boot, seed),
        "scored": population(ev.served.take(ev.served.status == "ok"), card, n_boot, seed),
        "all": population(ev.lifted.take(ev.lifted.status == "ok"), card, n_boot, seed),
    }


# ---------------------------------------------------------------- training's read of the stays


def training_data_warning(manifest: Manifest, data: Path, n_test: int) -> str | None:
    """A warning when `data` is the dataset the model was trained on: its provenance.json names
    the manifest's dataset and its test split has the manifest's test size. Then the site's
    train and val splits hold the model's own training stays: the figures on them are not an
    external validation, and only the test split was kept out of training."""
    try:
        source = json.loads((Path(data) / "provenance.json").read_text()).get("source")
    except (OSError, ValueError):
        return None
    test = manifest.provenance.splits.get("test")
    sources = manifest.provenance.dataset.split(" + ")
    if source and source in sources[1:]:  # an extra source of multi-source training
        return (f"{data} is one of the datasets this model was trained on ({source}): its "
                "train and val splits were training stays, so the figures on them are "
                "optimistic; only its test split was kept out of training (--split test)")
    if not source or source != sources[0] or test is None or test.n != n_test:
        return None
    return (f"{data} is the dataset this model was trained on ({source}): the figures on its "
            "train and val splits are optimistic, so this is not an external validation; only "
            "the test split was kept out of training (--split test)")


def site_checks(ev: Evaluated, data: Path, splits: tuple[str, ...]) -> dict[str, Any]:
    """What needs the stays' static inputs or channels, read by training's reader (the same
    files): the channels the site never records, the channels the model never saw in training,
    and the fairness audit of the scored stays (groups on the served risk and alert; the sex
    flip from `scehr score` on the same stays with only the recorded sex flipped)."""
    from scehr.training.data.splits import load_split

    fs = FeatureSet.from_dict(ev.manifest.feature_set)
    arrays = {s: load_split(data, ev.manifest.task, s, fs) for s in splits}
    n_all = sum(len(a) for a in arrays.values())
    cov = sum(a.coverage * len(a) for a in arrays.values()) / max(n_all, 1)
    out: dict[str, Any] = {
        "neutralised_channels": [v for v in fs.variable_ids
                                 if ev.manifest.coverage.get(v, 1.0) <= 0.0],
        "never_observed": [v for v, c in zip(fs.variable_ids, np.atleast_1d(cov), strict=True)
                           if c == 0],
        "test_stays": len(arrays["test"]) if "test" in arrays else None}
    static = {str(n): row for a in arrays.values()
              for n, row in zip(a.stays, a.static_raw, strict=True)}
    ok = ev.served.status == "ok"
    keep = ok & np.array([n in static for n in ev.served.stays], dtype=bool)
    if not keep.any():
        return out
    s = ev.served.take(keep)
    static_raw = np.stack([static[n] for n in s.stays])
    out["fairness"] = {
        "data": f"the {len(s.y)} scored stays",
        "alert_rule": "the served alert at the model's default operating point "
                      f"({ev.card.default_operating_point or 'its default threshold'})",
        "groups": fairness.group_table(s.y, s.risk, s.alert, static_raw)}
    if ev.sex_flipped is not None:
        f = ev.sex_flipped.take(keep)
        out["fairness"]["sex_flip"] = fairness.sex_flip(s.risk, f.risk, s.alert, f.alert,
                                                        static_raw)
    return out


# ---------------------------------------------------------------- the report


def _evaluated(folder: Path, data: Path, splits: tuple[str, ...],
               stays: Collection[str] | None, sex_flip: bool = False) -> Evaluated:
    m = load_manifest(Path(folder) / "manifest.json")
    if not task_spec(m.task).binary:
        raise ValueError(f"scehr evaluate reports on a binary task; {folder} is {m.task!r}")
    print(f"scehr evaluate: scoring {data} with {m.task} {m.version} through scehr score "
          "(the service's offline path), as served and with the data minimum lifted",
          file=sys.stderr, flush=True)
    got = served_scores(Path(folder), Path(data), m.task, m.classes[0].label, splits,
                        sex_flip=sex_flip)
    if stays is not None:
        wanted = set(stays)
        keep = np.array([s in wanted for s in got["served"].stays], dtype=bool)
        if not keep.any():
            raise ValueError(f"none of the {len(wanted)} stays asked for is in {data}")
        got = {k: v.take(keep) for k, v in got.items()}
    return Evaluated(Path(folder), m, got["served"], got["lifted"], got.get("sex_flipped"))


def _warnings(report: dict[str, Any], evs: list[Evaluated]) -> list[str]:
    """What a reader must not miss, in words: data the model was trained on, a model that
    never abstains or serves no interval, stays that could not be read, figures that cannot
    be estimated."""
    out = list(report["warnings"])
    for ev in evs:
        block = report["models"]["model" if ev is evs[0] else "compare"]
        if ev.manifest.data_minimum is None:
            out.append(f"{ev.name} declares no data minimum: it scores every stay, however "
                       "little data it holds (no abstention)")
        if ev.card.uncertainty is None:
            out.append(f"{ev.name} serves no risk interval: its coverage cannot be reported")
        if block["abstention"]["errors"]:
            out.append(f"{ev.name}: {block['abstention']['errors']} stays could not be read "
                       "(error rows of scehr score); they are in no figure")
        for pop, label in (("scored", "scored stays"), ("all", "all stays, minimum lifted")):
            for name, ci in block[pop]["metrics"].items():
                if isinstance(ci, dict) and ci.get("warning"):
                    out.append(f"{ev.name}, {label}: {name.replace('_', ' ')} "
                               f"{ci['warning']}")
    return list(dict.fromkeys(out))


def evaluate_external(folder: Path, data: Path, *, compare: Path | None = None,
                      split: str = "all", stays: Collection[str] | None = None,
                      n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """The report of `folder` (and `compare`, when given) on the stays of `split` of `data`
    (restricted to `stays` when given), as `scehr evaluate` prints and writes it."""
    return _build(folder, data, compare, split, stays, n_boot, seed)[0]


def _build(folder: Path, data: Path, compare: Path | None, split: str,
           stays: Collection[str] | None, n_boot: int, seed: int
           ) -> tuple[dict[str, Any], list[Evaluated]]:
    if split not in SPLIT_CHOICES:
        raise ValueError(f"--split {split!r}: expected one of {', '.join(SPLIT_CHOICES)}")
    splits = ALL_SPLITS if split == "all" else (split,)
    evs = [_evaluated(folder, data, splits, stays, sex_flip=True)]
    if compare is not None:
        evs.append(_evaluated(compare, data, splits, stays))
    checks = site_checks(evs[0], Path(data), splits)
    warning = training_data_warning(evs[0].manifest, Path(data),
                                    checks.pop("test_stays") or 0) if split != "test" else None
    try:
        source = json.loads((Path(data) / "provenance.json").read_text()).get("source")
    except (OSError, ValueError):
        source = None
    report: dict[str, Any] = {
        "report": "scehr evaluate", "report_version": 1,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "data": {"folder": str(data), "source": source, "split": split,
                 "stays": len(evs[0].served.y), "events": int(evs[0].served.y.sum()),
                 "restricted_to_given_stays": stays is not None},
        "how": "every stay scored by `scehr score` (the service's offline path) with the "
               "model's data minimum, and again with it lifted (--allow-insufficient); 95 % "
               f"percentile bootstrap CIs over stays ({n_boot} resamples, seed {seed})",
        "warnings": [warning] if warning else [],
        "models": {role: model_block(ev, n_boot, seed) for role, ev in zip(ROLES, evs,
                                                                         strict=False)},
        "site": checks,
    }
    report["warnings"] = _warnings(report, evs)
    return report, evs


def write_report(folder: Path, data: Path, out: Path, *, compare: Path | None = None,
                 split: str = "all", stays: Collection[str] | None = None,
                 n_boot: int = 1000, seed: int = 0, command: str = "",
                 title: str | None = None) -> dict[str, Any]:
    """`evaluate_external`, written to `out/`: report.json, report.html (self-contained: the
    figures inline, no network needed to open it) and the figures as PNG files.

    `folder` is the model the report is about (e.g. the shipped one), `compare` the one shown
    beside it (e.g. the site model recalibrated from it); `stays` restricts both to some stays
    of `data` (e.g. the held-out part of a recalibration); `command` is printed on the report
    as the line that made it."""
    from scehr.training.data.writer import write_json
    from scehr.training.report_html import render_html

    report, evs = _build(folder, data, compare, split, stays, n_boot, seed)
    report["command"] = command
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    report["plots"] = draw_figures(out, report, evs)
    write_json(out / "report.json", report)
    (out / "report.html").write_text(render_html(report, out, title=title))
    return report


def draw_figures(out: Path, report: dict[str, Any], evs: list[Evaluated]) -> dict[str, str]:
    """The report's figures as PNG files in `out`, by name."""
    from scehr.training.plots import plot_pr_curves, plot_roc_curves
    from scehr.training.report_plots import (
        plot_coverage_by_decile,
        plot_point_rates,
        plot_reliability_bands,
        plot_risk_by_outcome,
    )

    blocks = [report["models"][r] for r in ROLES if r in report["models"]]
    names = [ev.manifest.version for ev in evs]
    if len(names) > 1 and names[1] == names[0]:
        names[1] += " (compared)"
    first, ev0 = blocks[0], evs[0]
    scored0 = ev0.served.take(ev0.served.status == "ok")
    curves: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    cis: dict[str, dict[str, Any]] = {}
    for ev, name, block in zip(evs, names, blocks, strict=True):
        pops = (("scored", ev.served, "scored"), ("all", ev.lifted, "all stays, minimum lifted"))
        for pop, s, words in pops[: 2 if ev is ev0 else 1]:
            s = s.take(s.status == "ok")
            key = f"{name}, {words} (n={len(s.y)})"
            curves[key], cis[key] = (s.y, s.risk), block[pop]["metrics"]
    label = ev0.card.label.replace("_", " ")
    files = {
        "reliability": plot_reliability_bands(
            out / "reliability.png", {n: b["scored"]["reliability"] for n, b in
                                      zip(names, blocks, strict=True)},
            title=f"{label}: reliability on the scored stays"),
        "roc": plot_roc_curves(out / "roc.png", curves,
                               cis={k: v["auroc"] for k, v in cis.items() if "auroc" in v},
                               title=f"{label}: ROC"),
        "pr": plot_pr_curves(out / "pr.png", curves,
                             cis={k: v["auprc"] for k, v in cis.items() if "auprc" in v},
                             title=f"{label}: precision-recall"),
        "risk_by_outcome": plot_risk_by_outcome(
            out / "risk_by_outcome.png", scored0.y, scored0.risk,
            {p["name"]: p["threshold"] for p in first["scored"]["operating_points"]
             if p["threshold"] is not None},
            title=f"{names[0]}: served risk of the scored stays ({label})"),
        "alert_rates": plot_point_rates(
            out / "alert_rates.png", {n: b["scored"]["operating_points"] for n, b in
                                      zip(names, blocks, strict=True)},
            title="Alerts at each named operating point (scored stays)"),
    }
    with_sets = {n: b["scored"]["coverage"]["by_decile"] for n, b in
                 zip(names, blocks, strict=True) if b["scored"]["coverage"]}
    if with_sets:
        level = next(b["scored"]["coverage"]["level"] for b in blocks
                     if b["scored"]["coverage"])
        files["coverage_by_decile"] = plot_coverage_by_decile(
            out / "coverage_by_decile.png", with_sets, level,
            title="Served outcome sets: coverage by risk decile (scored stays)")
    return {k: Path(v).name for k, v in files.items()}
