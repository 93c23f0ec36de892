"""A landmark model's `trajectory` section, every choice made on validation.

- the first supported hour: the earliest hour from which validation AUROC stays at least
  `FIRST_HOUR_AUROC` at every later hour;
- bands of landmark hours (`BAND_STARTS`), each with its own calibration map (fitted on the
  calibration split's (stay, hour) rows of the band, chosen on validation's), uncertainty map
  and data minimum (the 48-hour sufficiency study and rule, `scehr.training.sufficiency`, on
  validation's stays truncated at the band's first hour);
- the alert policy: the grid point that alerts for the most deaths at some hour while raising at
  most `MAX_ALERTS_PER_DAY` alerts per patient-day on validation (the fewest alerts among ties).

`served_risks` and `alert_figures` are also what the set-C evaluation reads, so the figures of
the evaluation are those of the served trajectory.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from scehr.schemas.alert_policy import AlertPolicy, alert_hours
from scehr.schemas.featureset import FeatureSet
from scehr.schemas.manifest import Calibration, Trajectory, TrajectoryBand
from scehr.schemas.sufficiency import (
    EPS,
    DataMinimum,
    DataSummary,
    SplitFigures,
    shortfalls,
    summarize_by_hour,
)
from scehr.schemas.tensorize import Observations
from scehr.schemas.uncertainty import RiskUncertainty
from scehr.training.calibration import expected_calibration_error
from scehr.training.metrics import auroc
from scehr.training.serving_assets import fit_calibration
from scehr.training.sufficiency import (
    LEVELS,
    SEED,
    Study,
    choose,
    data_minimum,
    degrade,
    figures,
    rule_text,
)
from scehr.training.uncertainty import coverage, fit_uncertainty

#: Validation AUROC an hour needs (with every later hour) to be served.
FIRST_HOUR_AUROC = 0.75
#: Candidate first hours: the first 12 hours of the window.
FIRST_HOUR_CANDIDATES = tuple(range(1, 13))
#: The bands' first hours after the first supported one (6-11, 12-23, 24-35, 36-48 from hour 6).
BAND_STARTS = (12, 24, 36)
#: The alert-policy grid searched on validation.
THRESHOLDS = tuple(np.round(np.arange(0.10, 0.61, 0.025), 3))
SILENCE_HOURS = (6, 12, 24, 48)
REALERT_RISES = (0.1, 0.2, 0.3)
#: The alert budget and the target share of deaths alerted (the issue's targets).
MAX_ALERTS_PER_DAY = 0.3
TARGET_DEATHS_ALERTED = 2 / 3

CALIBRATION_WHERE = ("calibration split's (stay, hour) rows of the band (held out of training "
                     "and early stopping); chosen and scored on validation's")
UNCERTAINTY_WHERE = ("calibration split's (stay, hour) rows of the band; level chosen on "
                     "validation's")

Preds = dict[str, np.ndarray]
#: Per way of measuring data (`DataSummary`'s fields), [N, T]: what each stay holds up to hour
#: t + 1 (NaN hours since last: nothing observed).
Held = dict[str, np.ndarray]
HELD_FIELDS = ("observations", "channels", "hours_covered", "hours_since_last")


def rows(preds: Preds, first: int, last: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(y, probability, margin) of every (stay, hour) in the hours' populations."""
    cols = np.arange(first - 1, last)
    inside = preds["inside"][:, cols]
    y = np.broadcast_to(preds["y"][:, None], inside.shape)[inside]
    return y, preds["probability"][:, cols][inside], preds["margin"][:, cols][inside]


def first_hour(val: Preds, last_hour: int) -> int:
    """The earliest candidate hour from which validation AUROC >= FIRST_HOUR_AUROC at every
    hour up to `last_hour`; the last candidate when none is."""
    ok = [h for h in range(1, last_hour + 1)
          if auroc(*rows(val, h, h)[:2]) >= FIRST_HOUR_AUROC]
    for h in FIRST_HOUR_CANDIDATES:
        if all(k in ok for k in range(h, last_hour + 1)):
            return h
    return FIRST_HOUR_CANDIDATES[-1]


def bands_of(first: int, last: int) -> list[tuple[int, int]]:
    starts = [first, *(s for s in BAND_STARTS if first < s <= last)]
    return list(zip(starts, [s - 1 for s in starts[1:]] + [last], strict=True))


def served_risks(traj: Trajectory, preds: Preds) -> np.ndarray:
    """[N, T] served risk at every hour (NaN before first_hour, after last_hour and outside the
    hour's population), each hour through its band's calibration."""
    out = np.full(preds["probability"].shape, np.nan)
    for b in traj.bands:
        cols = np.arange(b.from_hour - 1, b.to_hour)
        out[:, cols] = b.calibration.apply(preds["probability"][:, cols],
                                           preds["margin"][:, cols])
    out[~preds["inside"]] = np.nan
    return out


def alert_figures(policy: AlertPolicy, risks: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """What the policy does on stays with served risks [N, T] (NaN: no risk that hour):
    alerts per patient-day (days with a served risk), the share of deaths and of survivors
    alerted at some hour, and for alerted deaths the hours from the first alert to hour T."""
    hours = list(range(1, risks.shape[1] + 1))
    n_alerts, firsts = [], []
    for r in risks:
        a = alert_hours(policy, hours, [None if np.isnan(v) else float(v) for v in r])
        n_alerts.append(len(a))
        firsts.append(a[0] if a else None)
    days = float(np.sum(~np.isnan(risks))) / 24.0
    died = y > 0.5
    alerted = np.array([f is not None for f in firsts])
    lead = [risks.shape[1] - f for f, d in zip(firsts, died, strict=True)
            if d and f is not None]
    return {"alerts_per_patient_day": float(np.sum(n_alerts) / days) if days else float("nan"),
            "deaths_alerted": float(alerted[died].mean()) if died.any() else float("nan"),
            "survivors_alerted": float(alerted[~died].mean()) if (~died).any() else float("nan"),
            "median_hours_first_alert_to_end": float(np.median(lead)) if lead else None,
            "stays": len(y), "deaths": int(died.sum())}


def policy_grid(risks: np.ndarray, y: np.ndarray) -> list[tuple[AlertPolicy, dict[str, Any]]]:
    """Every grid policy with its figures on these stays (the trade-off curve's points)."""
    out = []
    for t, s, r in itertools.product(THRESHOLDS, SILENCE_HOURS, REALERT_RISES):
        p = AlertPolicy(threshold=float(t), silence_hours=s, realert_rise=r)
        out.append((p, alert_figures(p, risks, y)))
    return out


def choose_policy(grid: list[tuple[AlertPolicy, dict[str, Any]]]) -> AlertPolicy:
    """Within the alert budget, the most deaths alerted, then the fewest alerts."""
    within = [(p, f) for p, f in grid if f["alerts_per_patient_day"] <= MAX_ALERTS_PER_DAY]
    rule = (f"on validation, among the grid's policies with at most {MAX_ALERTS_PER_DAY} alerts "
            "per patient-day, the one alerting for the most deaths at some hour (then the "
            "fewest alerts)")
    if not within:
        within = [min(grid, key=lambda pf: pf[1]["alerts_per_patient_day"])]
        rule = (f"on validation no policy of the grid stays within {MAX_ALERTS_PER_DAY} alerts "
                "per patient-day: the one with the fewest alerts")
    p, f = max(within, key=lambda pf: (pf[1]["deaths_alerted"],
                                       -pf[1]["alerts_per_patient_day"]))
    met = (f["deaths_alerted"] >= TARGET_DEATHS_ALERTED
           and f["alerts_per_patient_day"] <= MAX_ALERTS_PER_DAY)
    rule += (f"; the target ({TARGET_DEATHS_ALERTED:.0%} of deaths within the budget) is "
             f"{'met' if met else 'not met'}")
    return p.model_copy(update={"rule": rule, "validation": {
        k: (round(v, 4) if isinstance(v, float) else v) for k, v in f.items()}})


def band_metrics(y: np.ndarray, risk: np.ndarray) -> dict[str, float]:
    return {"n_rows": int(y.size), "auroc": round(auroc(y, risk), 4),
            "ece": round(expected_calibration_error(y, risk), 4)}


def held_by_hour(obs: Observations, n_stays: int, last_hour: int, fs: FeatureSet) -> Held:
    """What each stay of `obs` holds up to each hour 1..last_hour, counted as the service
    counts it (`summarize_by_hour`)."""
    out = {f: np.full((n_stays, last_hour), np.nan) for f in HELD_FIELDS}
    bounds = np.searchsorted(obs.stay, np.arange(n_stays + 1))  # obs is ordered by stay
    hours = np.arange(1, last_hour + 1, dtype=np.float64)
    for i in range(n_stays):
        one = obs.take(np.arange(bounds[i], bounds[i + 1]))
        for t, s in enumerate(summarize_by_hour(one, i, hours, fs)):
            for f in HELD_FIELDS:
                v = getattr(s, f)
                out[f][i, t] = np.nan if v is None else v
    return out


#: (probability, margin) [N] of every validation stay at hour h, from its observations
#: (`Observations` of all the split's stays) with the window ending at h.
RiskAt = Callable[[Observations, int], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class MinimumStudy:
    """What choosing the bands' data minimums needs: validation's observations as read, what
    each stay holds by hour, and the model run on (degraded) observations."""

    obs: Observations
    fs: FeatureSet
    held: Held
    risk_at: RiskAt


def band_minimum(study: MinimumStudy, val: Preds, cal: Calibration, first: int, last: int
                 ) -> DataMinimum:
    """The band's data minimum: the 48-hour study and rule (`scehr.training.sufficiency`) on
    validation's stays truncated at the band's first hour (its least data), served risks
    through the band's calibration; with the validation figures of the band's rows it keeps."""
    alive = val["inside"][:, first - 1]
    y = val["y"][alive]
    upto = study.obs.take(study.obs.time <= first + EPS)

    def served(obs: Observations) -> np.ndarray:
        p, m = study.risk_at(obs, first)
        return cal.apply(p[alive], m[alive])

    res: Study = {"full": [figures(y, served(upto))]}
    for how, levels in LEVELS.items():
        res[how] = [{"level": lv, **figures(y, served(degrade(
            upto, study.fs, how, lv, float(first), np.random.default_rng(SEED))))}
            for lv in levels]
    minimum = data_minimum(choose(res), rule_text(
        f"applied to validation's {int(alive.sum())} stays truncated at hour {first}, the "
        f"first of the band {first}-{last}, data removed and the model run again; the landmark "
        "export, scehr.training.landmark_assets"), "docs/risk-over-time.md")
    cols = np.arange(first - 1, last)
    inside = val["inside"][:, cols]
    rows_held = {f: study.held[f][:, cols][inside] for f in HELD_FIELDS}
    yr, pr, mr = rows(val, first, last)
    minimum.validation = split_figures(yr, cal.apply(pr, mr), meets(rows_held, minimum))
    return minimum


def meets(held: Held, minimum: DataMinimum) -> np.ndarray:
    """Element by element over `held`'s arrays, whether the data meets `minimum` (the service's
    rule, `shortfalls`)."""
    flat = [held[f].ravel() for f in HELD_FIELDS]
    ok = [not shortfalls(DataSummary(int(o), int(c), float(h), None if np.isnan(g) else float(g)),
                         minimum) for o, c, h, g in zip(*flat, strict=True)]
    return np.array(ok, dtype=bool).reshape(held["observations"].shape)


def below_minimum(traj: Trajectory, held: Held) -> np.ndarray:
    """[N, T]: the hours the served trajectory abstains at for too little data (its band's
    minimum on the data up to the hour)."""
    out = np.zeros(held["observations"].shape, dtype=bool)
    for b in traj.bands:
        if b.data_minimum is not None:
            cols = slice(b.from_hour - 1, b.to_hour)
            out[:, cols] = ~meets({f: held[f][:, cols] for f in HELD_FIELDS}, b.data_minimum)
    return out


def split_figures(y: np.ndarray, risk: np.ndarray, kept: np.ndarray) -> SplitFigures:
    """How the served risks do on the rows a minimum keeps (and on all of them)."""
    return SplitFigures(
        n=len(y), kept=int(kept.sum()),
        auroc=round(auroc(y[kept], risk[kept]), 4) if kept.any() else None,
        ece=round(expected_calibration_error(y[kept], risk[kept]), 4) if kept.any() else None,
        auroc_all=round(auroc(y, risk), 4),
        outcome_rate_kept=round(float(y[kept].mean()), 4) if kept.any() else None,
        outcome_rate_abstained=round(float(y[~kept].mean()), 4) if (~kept).any() else None)


def band(calib: Preds, val: Preds, test: Preds, study: MinimumStudy, first: int, last: int,
         logistic_input: Literal["margin", "probability"]) -> TrajectoryBand:
    """One band's calibration, uncertainty map and data minimum, with its figures."""
    cal = fit_calibration(rows(calib, first, last), rows(val, first, last), CALIBRATION_WHERE,
                          logistic_input)

    def risk(preds: Preds) -> tuple[np.ndarray, np.ndarray]:
        y, p, m = rows(preds, first, last)
        return y, cal.apply(p, m)

    unc: RiskUncertainty = fit_uncertainty(risk(calib), risk(val), UNCERTAINTY_WHERE,
                                           test=risk(test))
    minimum = band_minimum(study, val, cal, first, last)
    return TrajectoryBand(
        from_hour=first, to_hour=last, calibration=cal, uncertainty=unc, data_minimum=minimum,
        metrics={"validation": band_metrics(*risk(val)), "test": band_metrics(*risk(test))})


def trajectory(calib: Preds, val: Preds, test: Preds, study: MinimumStudy, last_hour: int,
               logistic_input: Literal["margin", "probability"]) -> Trajectory:
    """The whole section, from every split's per-hour predictions (`predict_hours`) and
    validation's minimum study."""
    first = first_hour(val, last_hour)
    bands = [band(calib, val, test, study, a, b, logistic_input)
             for a, b in bands_of(first, last_hour)]
    placeholder = AlertPolicy(threshold=0.5, silence_hours=0, realert_rise=1.0)
    traj = Trajectory(first_hour=first, last_hour=last_hour, bands=bands,
                      alert_policy=placeholder)
    risks = served_risks(traj, val)
    risks[below_minimum(traj, study.held)] = np.nan  # abstained hours never alert
    policy = choose_policy(policy_grid(risks, val["y"]))
    return traj.model_copy(update={"alert_policy": policy})


def coverage_by_hour(traj: Trajectory, preds: Preds, split: str) -> dict[int, dict[str, Any]]:
    """Each hour's coverage of its band's outcome sets (the map's nominal level beside it)."""
    risks = served_risks(traj, preds)
    out = {}
    for h in range(traj.first_hour, traj.last_hour + 1):
        b = traj.band(h)
        assert b is not None and b.uncertainty is not None
        keep = ~np.isnan(risks[:, h - 1])
        c = coverage(b.uncertainty, preds["y"][keep], risks[keep, h - 1], split)
        out[h] = {"level": b.uncertainty.level, "coverage": round(c.coverage, 4),
                  "mean_width": round(c.mean_width, 4)}
    return out



def from_prepared(model: Any, crit: Any, data: Any, roots: list[Path],
                  logistic_input: Literal["margin", "probability"]) -> Trajectory:
    """The section of a trained landmark run, from its prepared splits (`fit.prepare`) and
    its data folders `roots` (validation's observations, for the bands' data minimums)."""
    import torch

    from scehr.schemas.tensorize import discretize
    from scehr.training.fit import TensorSplit
    from scehr.training.landmark import predict_hours
    from scehr.training.sufficiency import split_observations

    if data is None or data.calib is None:
        raise ValueError("a landmark model's trajectory section needs the run's data folder "
                         "and a calibration split (calibration_fraction > 0)")
    preds = {s: predict_hours(model, crit, getattr(data, s)) for s in ("calib", "val", "test")}
    last_hour = int(data.val.x.shape[1])
    raw = data.raw["val"]
    obs = split_observations(roots, raw)

    def risk_at(o: Observations, hour: int) -> tuple[np.ndarray, np.ndarray]:
        x, lengths = discretize(o, raw.feature_set, np.full(o.n_stays, float(hour)))
        split = TensorSplit(torch.from_numpy(data.normalizer.transform(x, lengths)),
                            torch.from_numpy(lengths.astype(np.int64)), data.val.static,
                            data.val.y, data.val.stays)
        p = predict_hours(model, crit, split)
        return p["probability"][:, hour - 1], p["margin"][:, hour - 1]

    study = MinimumStudy(obs, raw.feature_set,
                         held_by_hour(obs, len(raw), last_hour, raw.feature_set), risk_at)
    return trajectory(preds["calib"], preds["val"], preds["test"], study, last_hour,
                      logistic_input)
