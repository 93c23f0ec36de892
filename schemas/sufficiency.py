"""Is there enough data in a stay to estimate its risk? The one rule, against the manifest.

A model declares its minimum as data (`Manifest.data_minimum`, chosen on validation by the
sufficiency study, `scehr.training.sufficiency`). This module measures a prepared stay the way the
study degraded stays (observations in the window, channels, hours covered, hours since the
last observation) and says, in words naming what is missing, where it falls short. Service,
`scehr score` and the study all call `summarize` + `shortfalls`, so the rule lives only here.

Only observations inside the model's window count: an observation after the window, or a
value removed as implausible, never reached the model and is no data. Descriptors recorded
once at admission (ICU type, height) are not measurements over time and do not count either.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from scehr.schemas.featureset import FeatureSet
from scehr.schemas.tensorize import Observations

#: Variables recorded once at admission: not evidence of how the stay is going.
DESCRIPTORS = frozenset({"icu_type", "height"})
EPS = 1e-6


class SplitFigures(BaseModel):
    """How the model does on the stays of one split that meet the minimum."""

    model_config = ConfigDict(extra="forbid")

    n: int = Field(description="Stays in the split")
    kept: int = Field(description="Stays that meet the minimum (scored)")
    auroc: float | None = Field(None, description="AUROC on the kept stays (first class)")
    ece: float | None = Field(None, description="Expected calibration error on the kept stays")
    auroc_all: float | None = Field(None, description="AUROC on every stay, for comparison")
    outcome_rate_kept: float | None = Field(None, description="Outcome rate of the kept stays")
    outcome_rate_abstained: float | None = Field(
        None, description="Outcome rate of the stays below the minimum")


class DataMinimum(BaseModel):
    """The least data a stay needs before the model gives it a risk (chosen on validation).

    A stay falls short when any bound fails; each failed bound is one reason."""

    model_config = ConfigDict(extra="forbid")

    min_observations: int = Field(ge=1, description="Observations inside the window")
    min_channels: int = Field(ge=1, description="Distinct variables observed in the window")
    min_hours_covered: float = Field(
        0.0, ge=0, description="Hours from the first to the last observation in the window")
    max_hours_since_last: float | None = Field(
        None, ge=0, description="Hours from the last observation to the window's end")
    rule: str = Field(description="How the bounds were chosen, in words")
    study: str = Field("", description="Where the study is written up (docs path)")
    validation: SplitFigures | None = None
    test: SplitFigures | None = None


@dataclass(frozen=True)
class DataSummary:
    """What one stay holds inside the window (counts and hours only, no values)."""

    observations: int
    channels: int
    hours_covered: float
    hours_since_last: float | None  # None: nothing observed

    def as_dict(self) -> dict[str, float | int | None]:
        return {"observations": self.observations, "channels": self.channels,
                "hours_covered": round(self.hours_covered, 3),
                "hours_since_last": None if self.hours_since_last is None
                else round(self.hours_since_last, 3)}


@lru_cache(maxsize=32)
def counted(fs: FeatureSet) -> np.ndarray:
    """[channels] bool: the channels whose observations count as data (read-only: shared)."""
    out = np.array([v not in DESCRIPTORS for v in fs.variable_ids], dtype=bool)
    out.setflags(write=False)
    return out


def summarize(obs: Observations, end_hours: np.ndarray, fs: FeatureSet) -> list[DataSummary]:
    """One summary per stay of `obs` (indices 0..len(end_hours)-1): observations with
    0 <= time <= the stay's window end, of counted channels."""
    end = np.asarray(end_hours, dtype=np.float64)
    n = len(end)
    if n == 1:
        return [_one(obs, float(end[0]), fs)]
    keep = (obs.stay < n) & counted(fs)[obs.channel] & (obs.time >= -EPS)
    keep &= obs.time <= end[np.minimum(obs.stay, n - 1)] + EPS
    st, ch, t = obs.stay[keep], obs.channel[keep], obs.time[keep]
    count = np.bincount(st, minlength=n)
    pairs = np.unique(st * fs.n_channels + ch)
    chans = np.bincount(pairs // fs.n_channels, minlength=n)
    first = np.full(n, np.inf)
    last = np.full(n, -np.inf)
    np.minimum.at(first, st, t)
    np.maximum.at(last, st, t)
    out = []
    for i in range(n):
        if count[i] == 0:
            out.append(DataSummary(0, 0, 0.0, None))
            continue
        out.append(DataSummary(int(count[i]), int(chans[i]), float(last[i] - first[i]),
                               float(max(end[i] - last[i], 0.0))))
    return out


def _one(obs: Observations, end: float, fs: FeatureSet) -> DataSummary:
    """`summarize` of stay 0 alone (a served request): the same figures in a few whole-array
    calls, without the per-stay scatter (`ufunc.at`) and `unique` a batch needs."""
    keep = (obs.stay == 0) & counted(fs)[obs.channel] & (obs.time >= -EPS)
    keep &= obs.time <= end + EPS
    t = obs.time[keep]
    if not len(t):
        return DataSummary(0, 0, 0.0, None)
    chans = np.count_nonzero(np.bincount(obs.channel[keep], minlength=fs.n_channels))
    first, last = t.min(), t.max()
    return DataSummary(len(t), int(chans), float(last - first), float(max(end - last, 0.0)))


def summarize_by_hour(obs: Observations, stay: int, hours: np.ndarray, fs: FeatureSet
                      ) -> list[DataSummary]:
    """`summarize` of stay `stay` with its window ending at each of `hours` in turn (a
    landmark model's data minimum applies to the data up to its hour): the same counts, in
    one sort of the stay's observations instead of one pass per hour."""
    keep = (obs.stay == stay) & counted(fs)[obs.channel] & (obs.time >= -EPS)
    order = np.argsort(obs.time[keep], kind="stable")
    t, ch = obs.time[keep][order], obs.channel[keep][order]
    # a channel counts from its first observation on
    firsts = np.sort(t[np.unique(ch, return_index=True)[1]]) if len(t) else t
    ends = np.asarray(hours, dtype=np.float64)
    seen = np.searchsorted(t, ends + EPS, side="right")
    chans = np.searchsorted(firsts, ends + EPS, side="right")
    out = []
    for end, k, c in zip(ends.tolist(), seen.tolist(), chans.tolist(), strict=True):
        if k == 0:
            out.append(DataSummary(0, 0, 0.0, None))
            continue
        last = float(t[k - 1])
        out.append(DataSummary(k, c, last - float(t[0]), max(end - last, 0.0)))
    return out


def shortfalls(s: DataSummary, m: DataMinimum) -> list[str]:
    """The bounds `s` misses, each in words naming what is missing; empty when it suffices."""
    out = []
    if s.observations < m.min_observations:
        out.append(f"{s.observations} observation(s) inside the window; this model needs at "
                   f"least {m.min_observations}")
    if s.channels < m.min_channels:
        out.append(f"{s.channels} variable(s) observed inside the window; this model needs at "
                   f"least {m.min_channels} different ones")
    if m.min_hours_covered > 0 and s.hours_covered < m.min_hours_covered - EPS:
        out.append(f"the observations span {s.hours_covered:.1f} h; this model needs them to "
                   f"span at least {m.min_hours_covered:g} h")
    if m.max_hours_since_last is not None and s.hours_since_last is not None \
            and s.hours_since_last > m.max_hours_since_last + EPS:
        out.append(f"the last observation is {s.hours_since_last:.1f} h before the window's "
                   f"end; this model needs one within {m.max_hours_since_last:g} h of it")
    return out
