"""The per-row ingest as it was before the vectorised fast path: oracle and benchmark baseline.

A frozen copy of `schemas/ingest.py` (one Python `_add` call per observation, every loc list
built eagerly). `tests/schemas/test_ingest_equivalence.py` checks the fast implementation
against it field by field and `benchmarks/ingest_throughput.py` times both. Do not optimise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from scehr.schemas.featureset import STATIC_FIELDS, FeatureSet
from scehr.schemas.payloads import Notice, Problem, StayPayload
from scehr.schemas.tensorize import Observations, clean
from scehr.schemas.variables import CategoryError, UnitError, did_you_mean, in_catalog

DEFAULT_MAX_OBSERVATIONS = 20_000


@dataclass
class StayIngest:
    """One stay's observations in canonical form, or the problems that stopped it."""

    channel: list[int] = field(default_factory=list)
    time: list[float] = field(default_factory=list)
    value: list[float] = field(default_factory=list)
    loc: list[list[str | int]] = field(default_factory=list)
    static: list[float] = field(default_factory=lambda: [np.nan] * len(STATIC_FIELDS))
    problems: list[Problem] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    end_hours: float = 0.0


@dataclass
class IngestResult:
    """Observations of the stays that passed (stay index = position in `ok`)."""

    stays: list[StayIngest]
    ok: list[int]
    observations: Observations
    static_raw: np.ndarray  # [len(ok), len(STATIC_FIELDS)], NaN where missing
    end_hours: np.ndarray  # [len(ok)]


def _hours(t: float | datetime, admission: datetime | None, loc: list[str | int],
           out: StayIngest) -> float | None:
    if isinstance(t, datetime):
        if admission is None:
            out.problems.append(Problem(
                loc=[*loc], rule="admission_time_required",
                message="an ISO timestamp needs `admission_time` on the stay",
            ))
            return None
        if (t.tzinfo is None) != (admission.tzinfo is None):
            out.problems.append(Problem(
                loc=[*loc], rule="timezone_mismatch",
                message="timestamp and admission_time must both have or both lack a timezone",
            ))
            return None
        return (t - admission).total_seconds() / 3600.0
    return float(t)


def _add(out: StayIngest, fs: FeatureSet, loc: list[str | int], variable: str,
         t: float | datetime, value: float | str, unit: str | None,
         admission: datetime | None, index: dict[str, int]) -> None:
    ch = index.get(variable)
    if ch is None:
        ch = index.get(variable.strip().lower())
    if ch is None:
        known = in_catalog(variable)
        where = (f"; the catalog's {known.id} is not an input of this model (feature set "
                 f"{fs.name}): score it with a model that reads it" if known
                 else did_you_mean(variable, fs.variables))
        out.problems.append(Problem(
            loc=[*loc, "variable"], rule="unknown_variable",
            message=f"unknown variable {variable!r}{where}",
            allowed=", ".join(v.id for v in fs.variables),
        ))
        return
    var = fs.variables[ch]
    hours = _hours(t, admission, [*loc, "time"], out)
    if hours is None:
        return
    if hours < 0:
        out.problems.append(Problem(
            loc=[*loc, "time"], rule="time_negative",
            message="time must be >= 0 hours since ICU admission", allowed=">= 0",
        ))
        return
    if var.is_categorical:
        if unit not in (None, ""):
            out.problems.append(Problem(loc=[*loc, "unit"], rule="unit_not_accepted",
                                        message=f"{var.id} is categorical and takes no unit"))
            return
        try:
            number = float(var.category_index(value))
        except CategoryError:
            out.problems.append(Problem(
                loc=[*loc, "value"], rule="unknown_category",
                message=f"not a category of {var.id}",
                allowed=", ".join(var.categories) + " (aliases: "
                + ", ".join(sorted(var.category_aliases)) + ")",
            ))
            return
    else:
        if isinstance(value, str):
            out.problems.append(Problem(loc=[*loc, "value"], rule="number_required",
                                        message=f"{var.id} takes a JSON number"))
            return
        try:
            number = var.convert(float(value), unit)
        except UnitError as e:
            rule = "unit_required" if unit in (None, "") else "unit_not_accepted"
            out.problems.append(Problem(loc=[*loc, "unit"], rule=rule, message=str(e),
                                        allowed=", ".join(var.unit_names())))
            return
    out.channel.append(ch)
    out.time.append(hours)
    out.value.append(number)
    out.loc.append(loc)


def _index(fs: FeatureSet) -> dict[str, int]:
    idx: dict[str, int] = {}
    for i, v in enumerate(fs.variables):
        idx[v.id] = i
        idx[v.benchmark_name] = i
        idx[v.benchmark_name.lower()] = i
    return idx


def ingest_stay(stay: StayPayload, fs: FeatureSet, *, strict: bool = False,
                max_observations: int = DEFAULT_MAX_OBSERVATIONS) -> StayIngest:
    """Check one stay and convert it to canonical units, category indices and hours."""
    out = StayIngest()
    index = _index(fs)
    adm = stay.admission_time
    n_given = 0
    if stay.observations is not None:
        n_given = len(stay.observations)
        if n_given > max_observations:
            out.problems.append(Problem(
                loc=["observations"], rule="too_many_observations",
                message=f"{n_given} observations; the limit is {max_observations}",
                allowed=f"<= {max_observations}",
            ))
            return out
        for i, o in enumerate(stay.observations):
            _add(out, fs, ["observations", i], o.variable, o.time, o.value, o.unit, adm, index)
    elif stay.wide is not None:
        w = stay.wide
        n_given = sum(v is not None for col in w.columns.values() for v in col)
        if n_given > max_observations:
            out.problems.append(Problem(
                loc=["wide", "columns"], rule="too_many_observations",
                message=f"{n_given} observations; the limit is {max_observations}",
                allowed=f"<= {max_observations}",
            ))
            return out
        for name, col in w.columns.items():
            if len(col) != len(w.hours):
                out.problems.append(Problem(
                    loc=["wide", "columns", name], rule="length_mismatch",
                    message=f"{len(col)} values for {len(w.hours)} rows in `hours`",
                ))
                continue
            unit = w.units.get(name)
            for r, v in enumerate(col):
                if v is not None:
                    _add(out, fs, ["wide", "columns", name, r], name, w.hours[r], v, unit, adm,
                         index)
    if n_given == 0:
        out.problems.append(Problem(loc=["observations" if stay.wide is None else "wide"],
                                    rule="empty_payload", message="the stay has no observations"))
    if stay.demographics is not None:
        d = stay.demographics
        out.static = [
            np.nan if d.age is None else float(d.age),
            np.nan if d.sex is None else float(d.sex == "male"),
        ]
    if out.problems:
        return out
    _apply_cleaning(out, fs, strict)
    _window_notices(out, fs, stay.end_hours)
    return out


def _apply_cleaning(out: StayIngest, fs: FeatureSet, strict: bool) -> None:
    obs = Observations(np.zeros(len(out.channel)), out.channel, out.time, out.value, 1)
    kept, rep = clean(obs, fs)
    for r in rep.rescaled_rows:
        var = fs.variables[out.channel[r]]
        out.notices.append(Notice(code="value_rescaled", loc=out.loc[r], variable=var.id,
                                  message=f"{var.id} value divided by "
                                  f"{var.plausible.scaled_by:g}: a scaled value (rule: "
                                  f"{var.plausible.rule(var.id)})"))
    for r in rep.implausible_rows:
        var = fs.variables[out.channel[r]]
        rule = var.plausible.rule(var.id)
        if strict:
            out.problems.append(Problem(loc=out.loc[r], rule="implausible_value",
                                        message=f"{var.id} value is not physiological",
                                        allowed=rule))
        else:
            out.notices.append(Notice(code="value_implausible", loc=out.loc[r], variable=var.id,
                                      message=f"{var.id} value treated as missing: not "
                                      f"physiological (rule: {rule})"))
    for rows, code, verb in ((rep.dropped_rows, "value_dropped", "dropped (outside outlier "
                              "bounds)"), (rep.clipped_rows, "value_clipped",
                                           "clipped to the valid range")):
        for r in rows:
            var = fs.variables[out.channel[r]]
            rng = var.ranges
            allowed = None if rng is None else f"{rng.valid_low:g} to {rng.valid_high:g}"
            if strict:
                out.problems.append(Problem(loc=out.loc[r], rule=code.replace("value_", "out_of_"
                                            "range_"), message=f"{var.id} value {verb}",
                                            allowed=allowed))
            else:
                out.notices.append(Notice(code=code, loc=out.loc[r], variable=var.id,
                                          message=f"{var.id} value {verb}; valid: {allowed}"))
    if strict and out.problems:
        return
    keep = np.ones(len(out.channel), dtype=bool)
    keep[rep.removed_rows] = False
    out.channel = kept.channel.tolist()
    out.time = kept.time.tolist()
    out.value = kept.value.tolist()
    out.loc = [loc for loc, k in zip(out.loc, keep, strict=True) if k]


def _window_notices(out: StayIngest, fs: FeatureSet, stay_end: float | None) -> None:
    last = max(out.time, default=0.0)
    if fs.window_hours is not None:
        out.end_hours = fs.window_hours
        after = sum(t > fs.window_hours + 1e-6 for t in out.time)
        if after:
            out.notices.append(Notice(
                code="observations_after_window",
                message=f"{after} observations after the {fs.window_hours:g} h window are ignored",
            ))
        if last < fs.window_hours - fs.timestep:
            out.notices.append(Notice(
                code="stay_shorter_than_window",
                message=f"last observation at {last:.1f} h, before the end of the "
                f"{fs.window_hours:g} h window: later hours carry forward the last values",
            ))
    else:
        if stay_end is None:
            out.notices.append(Notice(
                code="stay_end_unknown",
                message="no `end_hours` given: the window ends at the last observation "
                f"({last:.1f} h); training used the stay's length",
            ))
        out.end_hours = min(last if stay_end is None else stay_end, fs.max_hours)
        after = sum(t > out.end_hours + 1e-6 for t in out.time)
        if after:
            out.notices.append(Notice(
                code="observations_after_window",
                message=f"{after} observations after the {out.end_hours:g} h window are ignored",
            ))
    seen = set(out.channel)
    for i, v in enumerate(fs.variables):
        if i not in seen:
            out.notices.append(Notice(code="channel_not_observed", variable=v.id,
                                      message=f"{v.id} not observed: its normal value is used"))


def ingest(stays: list[StayPayload], fs: FeatureSet, *, strict: bool = False,
           max_observations: int = DEFAULT_MAX_OBSERVATIONS) -> IngestResult:
    """Ingest many stays; the ones without problems are stacked into one `Observations`."""
    parts = [ingest_stay(s, fs, strict=strict, max_observations=max_observations) for s in stays]
    ok = [i for i, p in enumerate(parts) if not p.problems]
    counts = [len(parts[i].channel) for i in ok]
    stay_idx = np.repeat(np.arange(len(ok)), counts)
    obs = Observations(
        stay_idx,
        np.fromiter((c for i in ok for c in parts[i].channel), np.int64, sum(counts)),
        np.fromiter((t for i in ok for t in parts[i].time), np.float64, sum(counts)),
        np.fromiter((v for i in ok for v in parts[i].value), np.float64, sum(counts)),
        len(ok),
    )
    static = np.array([parts[i].static for i in ok], dtype=np.float64).reshape(
        len(ok), len(STATIC_FIELDS))
    end = np.array([parts[i].end_hours for i in ok], dtype=np.float64)
    return IngestResult(parts, ok, obs, static, end)
