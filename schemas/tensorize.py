"""Stays -> model tensors: clean, discretize, impute, one-hot, mask, normalize.

The one implementation training and serving share. Up to normalization it equals the
mimic3-benchmarks `Discretizer(timestep=1.0, store_masks=True, impute_strategy='previous',
start_time='zero')` with `end` = the window: a time t falls in bin int(t/timestep - 1e-6), rows
after `end` are ignored, the last value in a bin wins (in time order, then input order), gaps
are forward-filled, then filled with the channel's normal value. Everything is vectorized over
many stays at once with numpy; no per-observation Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from scehr.schemas.featureset import STATIC_FIELDS, FeatureSet

EPS = 1e-6


@dataclass
class Observations:
    """Long-form observations of many stays (struct of arrays, one row per observation).

    `value` holds the canonical-unit number for continuous channels and the category index
    (one-hot position) for categorical channels. `channel` indexes the feature set's variables.
    """

    stay: np.ndarray  # int64 [n], 0..n_stays-1
    channel: np.ndarray  # int64 [n]
    time: np.ndarray  # float64 [n], hours since ICU admission
    value: np.ndarray  # float64 [n]
    n_stays: int

    def __post_init__(self) -> None:
        self.stay = np.asarray(self.stay, dtype=np.int64)
        self.channel = np.asarray(self.channel, dtype=np.int64)
        self.time = np.asarray(self.time, dtype=np.float64)
        self.value = np.asarray(self.value, dtype=np.float64)

    def __len__(self) -> int:
        return int(self.stay.shape[0])

    def take(self, index: np.ndarray) -> Observations:
        return Observations(
            self.stay[index], self.channel[index], self.time[index], self.value[index],
            self.n_stays,
        )


@dataclass
class CleaningReport:
    """Counts of the plausibility rule and the benchmark cleaning rule, per channel."""

    dropped: np.ndarray  # int64 [C] outside the benchmark's outlier bounds
    clipped: np.ndarray  # int64 [C]
    dropped_rows: np.ndarray  # int64 indices into the input observations
    clipped_rows: np.ndarray
    implausible: np.ndarray | None = None  # int64 [C] not physiological (`Plausible`)
    rescaled: np.ndarray | None = None  # int64 [C] a known scaling undone (pH x 100)
    implausible_rows: np.ndarray | None = None
    rescaled_rows: np.ndarray | None = None

    @property
    def removed_rows(self) -> np.ndarray:
        """Input rows that did not survive: implausible or outside the outlier bounds."""
        rows = self.dropped_rows if self.implausible_rows is None else np.union1d(
            self.dropped_rows, self.implausible_rows)
        return rows.astype(np.int64)


@lru_cache(maxsize=32)
def _plausible_bounds(fs: FeatureSet) -> np.ndarray:
    """[4, C]: low, high, 1 where the low bound is open, scale (NaN: none); +-inf unbounded."""
    inf = np.inf
    bounds = np.tile(np.array([[-inf], [inf], [0.0], [np.nan]]), (1, fs.n_channels))
    for i, v in enumerate(fs.variables):
        p = v.plausible
        if p is None or v.is_categorical:
            continue
        bounds[:, i] = (-inf if p.low is None else p.low, inf if p.high is None else p.high,
                        float(p.low_open), np.nan if p.scaled_by is None else p.scaled_by)
    bounds.flags.writeable = False
    return bounds


def plausibility_masks(channel: np.ndarray, value: np.ndarray, fs: FeatureSet
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The plausibility rule per row (`variables.Plausible`, the one place it is applied):
    (value with known scalings undone, implausible, rescaled).

    A value outside its variable's plausible range cannot be a measurement: it is to become
    missing. One that lies inside once divided by the variable's `scaled_by` is divided.
    """
    lo, hi, low_open, scale = _plausible_bounds(fs).take(channel, axis=1)
    ok = np.where(low_open > 0, value > lo, value >= lo) & (value <= hi)
    scaled = np.zeros(len(value), dtype=bool)
    rows = (~ok & ~np.isnan(scale)).nonzero()[0]
    if len(rows):
        v = value[rows] / scale[rows]
        fits = np.where(low_open[rows] > 0, v > lo[rows], v >= lo[rows]) & (v <= hi[rows])
        scaled[rows[fits]] = True
        value = value.copy()
        value[rows[fits]] = v[fits]
    return value, ~ok & ~scaled, scaled


@lru_cache(maxsize=32)
def _cleaning_bounds(fs: FeatureSet) -> np.ndarray:
    """[4, C]: outlier low, valid low, valid high, outlier high; +-inf where unbounded."""
    inf = np.inf
    bounds = np.tile(np.array([[-inf], [-inf], [inf], [inf]]), (1, fs.n_channels))
    for i, v in enumerate(fs.variables):
        if v.ranges is not None and not v.is_categorical:
            r = v.ranges
            bounds[:, i] = (r.outlier_low, r.valid_low, r.valid_high, r.outlier_high)
    bounds.flags.writeable = False
    return bounds


def cleaning_masks(channel: np.ndarray, value: np.ndarray, fs: FeatureSet
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The benchmark rule per row: (drop, clip, value clipped to the valid bounds).

    `drop`: outside the outlier bounds; `clip`: kept but outside the valid bounds.
    """
    lo_out, lo_val, hi_val, hi_out = _cleaning_bounds(fs).take(channel, axis=1)
    drop = (value < lo_out) | (value > hi_out)
    clip = ~drop & ((value < lo_val) | (value > hi_val))
    return drop, clip, value.clip(lo_val, hi_val)


@dataclass
class RowRules:
    """Per row, what the plausibility rule and then the benchmark rule decided."""

    value: np.ndarray  # float64: scalings undone, clipped to the valid bounds
    implausible: np.ndarray  # bool: not physiological, removed
    rescaled: np.ndarray  # bool: a known scaling undone (pH x 100)
    drop: np.ndarray  # bool: plausible but outside the outlier bounds, removed
    clip: np.ndarray  # bool: kept, clipped to the valid bounds

    @property
    def removed(self) -> np.ndarray:
        return self.implausible | self.drop


@lru_cache(maxsize=32)
def _untouched_bounds(fs: FeatureSet) -> np.ndarray:
    """[2, C]: the closed range in which neither rule changes or removes a value: inside the
    plausible range (an open low bound made closed with the next float up, which is exact),
    the outlier bounds and the valid bounds."""
    p_lo, p_hi, low_open, _ = _plausible_bounds(fs)
    closed_lo = np.where(low_open > 0, np.nextafter(p_lo, np.inf), p_lo)
    out_lo, val_lo, val_hi, out_hi = _cleaning_bounds(fs)
    bounds = np.stack([np.maximum.reduce([closed_lo, out_lo, val_lo]),
                       np.minimum.reduce([p_hi, out_hi, val_hi])])
    bounds.flags.writeable = False
    return bounds


def apply_rules(channel: np.ndarray, value: np.ndarray, fs: FeatureSet) -> RowRules:
    """The plausibility rule, then the benchmark rule on what is plausible: the one place both
    are combined (`clean` for converters and the reader, `scehr.schemas.ingest` for the service).

    Both rules run on the rows outside `_untouched_bounds` only (NaN included); every other row
    passes unchanged, as the rules would leave it: two lookups per row instead of eight."""
    lo, hi = _untouched_bounds(fs)
    rows = np.flatnonzero(~((value >= lo.take(channel)) & (value <= hi.take(channel))))
    out = value.copy()
    implausible, rescaled, drop, clip = np.zeros((4, len(value)), dtype=bool)
    if len(rows):
        plausible_value, implausible[rows], rescaled[rows] = plausibility_masks(
            channel[rows], value[rows], fs)
        drop[rows], clip[rows], out[rows] = cleaning_masks(channel[rows], plausible_value, fs)
    return RowRules(out, implausible, rescaled, drop & ~implausible, clip & ~implausible)


def clean(obs: Observations, fs: FeatureSet) -> tuple[Observations, CleaningReport]:
    """Apply the plausibility rule (`plausibility_masks`: implausible values are removed,
    known scalings undone), then the benchmark rule on what is left: drop outside the outlier
    bounds, clip to the valid bounds.

    Categorical channels are validated by category membership instead and pass unchanged.
    """
    c = fs.n_channels
    rules = apply_rules(obs.channel, obs.value, fs)
    drop, clip, implausible, rescaled = rules.drop, rules.clip, rules.implausible, rules.rescaled
    keep = ~rules.removed
    kept = Observations(obs.stay, obs.channel, obs.time, rules.value, obs.n_stays)
    if not keep.all():  # copies only when something was removed
        kept = kept.take(keep)
    ch = obs.channel
    report = CleaningReport(
        dropped=np.bincount(ch[drop], minlength=c),
        clipped=np.bincount(ch[clip], minlength=c),
        dropped_rows=np.flatnonzero(drop),
        clipped_rows=np.flatnonzero(clip),
        implausible=np.bincount(ch[implausible], minlength=c),
        rescaled=np.bincount(ch[rescaled], minlength=c),
        implausible_rows=np.flatnonzero(implausible),
        rescaled_rows=np.flatnonzero(rescaled),
    )
    return kept, report


@dataclass(frozen=True)
class _Layout:
    """Per feature set, the constants `discretize` needs on every call (computed once)."""

    normals: np.ndarray  # float32 [C]: normal value / normal category index
    continuous: np.ndarray  # int64: channels that are continuous
    continuous_columns: np.ndarray  # int64: their value columns
    categorical: np.ndarray  # int64: channels that are categorical
    categorical_begins: np.ndarray  # int64: their first one-hot column
    n_value_columns: int
    # (first channel, first value column, length) of each run of continuous channels whose
    # value columns are consecutive too: copied as slices, not through a fancy index
    continuous_runs: tuple[tuple[int, int, int], ...]


def _runs(channels: np.ndarray, columns: np.ndarray) -> tuple[tuple[int, int, int], ...]:
    """Maximal runs where both the channel and its column go up by one."""
    runs: list[list[int]] = []
    for ch, col in zip(channels.tolist(), columns.tolist(), strict=True):
        if runs and ch == runs[-1][0] + runs[-1][2] and col == runs[-1][1] + runs[-1][2]:
            runs[-1][2] += 1
        else:
            runs.append([ch, col, 1])
    return tuple((a, b, m) for a, b, m in runs)


@lru_cache(maxsize=32)
def _layout(fs: FeatureSet) -> _Layout:
    cat = np.array([v.is_categorical for v in fs.variables], dtype=bool)
    continuous = np.flatnonzero(~cat)
    return _Layout(np.array([v.normal_float for v in fs.variables], dtype=np.float32),
                   continuous, fs.continuous_columns, np.flatnonzero(cat),
                   fs.begins[cat], fs.n_value_columns,
                   _runs(continuous, fs.continuous_columns))


def in_stay_time_order(stay: np.ndarray, time: np.ndarray) -> bool:
    """Whether (stay, time) never decreases along the rows: then the given order is the
    (stay, time, input) order, and a stay's later observations come later."""
    if len(stay) < 2:
        return True
    # Slices, not np.diff: a third of the cost on one stay's few hundred rows.
    s0, s1, t0, t1 = stay[:-1], stay[1:], time[:-1], time[1:]
    return bool(((s1 > s0) | ((s1 == s0) & (t1 >= t0))).all())


def _winners(obs: Observations, bins: np.ndarray, n_t: int, c: int) -> np.ndarray:
    """[N, T, C] index of the observation that wins each (stay, bin, channel) cell; a cell
    without one holds `channel - C` (negative: < 0 means not observed).

    `obs` must be in (stay, time, input) order: then each cell's winner (its latest
    observation, the last given among equal times) is its largest index, which one unbuffered
    `maximum.at` finds (exact with repeated cells, unlike a fancy-index assignment).
    """
    dtype = np.int32 if len(obs) < np.iinfo(np.int32).max else np.int64
    win = np.empty(obs.n_stays * n_t * c, dtype=dtype)
    win.reshape(-1, c)[:] = np.arange(-c, 0, dtype=dtype)  # np.tile's result, cheaper
    np.maximum.at(win, (obs.stay * n_t + bins) * c + obs.channel,
                  np.arange(len(obs), dtype=dtype))
    return win.reshape(obs.n_stays, n_t, c)


def discretize(
    obs: Observations, fs: FeatureSet, end_hours: np.ndarray | float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Values + masks [N, T, F] (float32) and lengths [N] (valid bins per stay).

    `end_hours` is each stay's window end (the benchmark's `end`); by default the feature set's
    window, or for a whole-stay feature set the last observation time capped at `max_hours`.
    Stays shorter than the longest are padded with zeros after their length.
    """
    n, c = obs.n_stays, fs.n_channels
    if end_hours is None:
        if fs.window_hours is not None:
            end_hours = fs.window_hours
        else:
            last = np.zeros(n)
            np.maximum.at(last, obs.stay, obs.time)
            end_hours = np.minimum(last, fs.max_hours)
    end = np.asarray(end_hours, dtype=np.float64)
    if end.shape != (n,):  # one end for every stay (np.full: a tenth of broadcast_to's cost)
        end = np.full(n, float(end))
    lengths = np.maximum(fs.n_bins(end), 1)
    n_t = int(lengths.max()) if n else 1

    t = obs.time
    bins = np.trunc(t / fs.timestep - EPS).astype(np.int64)
    if n and (end == end[0]).all():  # one window for all: no per-row lookups
        row_end, row_length = end[0], lengths[0]
    else:
        row_end, row_length = end[obs.stay], lengths[obs.stay]
    inside = (t <= row_end + EPS) & (bins >= 0) & (bins < row_length)
    kept = obs
    if not inside.all():  # a copy of every array only when some rows fall outside
        kept, bins = obs.take(inside), bins[inside]
    if n == 1:  # every row is stay 0: only the times need be in order
        ordered = len(kept) < 2 or bool((kept.time[1:] >= kept.time[:-1]).all())
    else:
        ordered = in_stay_time_order(kept.stay, kept.time)
    if not ordered:
        # stable: equal times keep input order (one stay: the same order as the lexsort)
        order = (kept.time.argsort(kind="stable") if n == 1
                 else np.lexsort((kept.time, kept.stay)))
        kept, bins = kept.take(order), bins[order]
    win = _winners(kept, bins, n_t, c)
    observed = win >= 0

    # Forward fill along time: a stay's later bins hold later (larger) indices, so a running
    # maximum is the last observation at or before each bin. On many stays one strided
    # `maximum` per bin costs a third of `maximum.accumulate(axis=1)`; on a few, one call wins.
    # A never-observed cell keeps `channel - C`: it reads the channel's normal value, appended.
    if n * c < 1024:
        np.maximum.accumulate(win, axis=1, out=win)
    else:
        for i in range(1, n_t):
            np.maximum(win[:, i], win[:, i - 1], out=win[:, i])
    lay = _layout(fs)
    filled = np.concatenate((kept.value.astype(np.float32), lay.normals))[win]

    out = np.zeros((n, n_t, fs.n_features), dtype=np.float32)
    for ch, col, m in lay.continuous_runs:  # a third of the fancy index's cost on many stays
        out[:, :, col:col + m] = filled[:, :, ch:ch + m]
    if len(lay.categorical):
        # One-hot: one flat scatter of 1s at row start + column begin + category index.
        cols = lay.categorical_begins + filled[:, :, lay.categorical].astype(np.intp)
        cols += (np.arange(n * n_t, dtype=np.intp) * fs.n_features).reshape(n, n_t, 1)
        out.reshape(-1)[cols.reshape(-1)] = 1.0
    out[:, :, lay.n_value_columns :] = observed
    # Padding after each stay's own length stays zero.
    pad = np.arange(n_t)[None, :] >= lengths[:, None]
    if pad.any():
        out[pad] = 0.0
    return out, lengths


@dataclass
class Normalizer:
    """Z-score of continuous value columns only; one-hot and mask columns pass unchanged."""

    columns: np.ndarray  # int64 [K]
    means: np.ndarray  # float64 [K]
    stds: np.ndarray  # float64 [K]

    @classmethod
    def fit(cls, x: np.ndarray, lengths: np.ndarray, fs: FeatureSet) -> Normalizer:
        """Statistics over every valid time step of the training split."""
        cols = fs.continuous_columns
        valid = np.arange(x.shape[1])[None, :] < lengths[:, None]
        vals = x[valid][:, cols].astype(np.float64)
        return cls.of(cols, vals.mean(axis=0), vals.std(axis=0))

    @classmethod
    def of(cls, columns: np.ndarray, means: np.ndarray, stds: np.ndarray) -> Normalizer:
        """From the statistics however they were summed (in memory or streamed): a constant
        column (std below 1e-7) keeps std 1, so it is only shifted."""
        return cls(columns, means, np.where(stds < 1e-7, 1.0, stds))

    def transform(self, x: np.ndarray, lengths: np.ndarray | None = None) -> np.ndarray:
        out = np.array(x, dtype=np.float32, copy=True)
        out[..., self.columns] = (out[..., self.columns] - self.means) / self.stds
        if lengths is not None:
            out[np.arange(x.shape[1])[None, :] >= lengths[:, None]] = 0.0
        return out.astype(np.float32, copy=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "columns": self.columns.tolist(),
            "means": self.means.tolist(),
            "stds": self.stds.tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Normalizer:
        return cls(
            np.asarray(d["columns"], dtype=np.int64),
            np.asarray(d["means"], dtype=np.float64),
            np.asarray(d["stds"], dtype=np.float64),
        )


@dataclass
class StaticImputer:
    """Static demographics -> [N, 2*len(STATIC_FIELDS)]: value (median-imputed, scaled), flag."""

    medians: np.ndarray
    means: np.ndarray
    stds: np.ndarray

    @classmethod
    def fit(cls, raw: np.ndarray) -> StaticImputer:
        """`raw` is [N, len(STATIC_FIELDS)] with NaN for missing values."""
        med = np.nanmedian(np.where(np.isnan(raw).all(axis=0), 0.0, raw), axis=0)
        filled = np.where(np.isnan(raw), med, raw)
        std = filled.std(axis=0)
        return cls(med, filled.mean(axis=0), np.where(std < 1e-7, 1.0, std))

    def transform(self, raw: np.ndarray) -> np.ndarray:
        raw = np.asarray(raw, dtype=np.float64).reshape(-1, len(STATIC_FIELDS))
        missing = np.isnan(raw)
        vals = (np.where(missing, self.medians, raw) - self.means) / self.stds
        out = np.empty((raw.shape[0], 2 * raw.shape[1]), dtype=np.float32)
        out[:, 0::2] = vals
        out[:, 1::2] = missing
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "fields": list(STATIC_FIELDS),
            "medians": self.medians.tolist(),
            "means": self.means.tolist(),
            "stds": self.stds.tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StaticImputer:
        return cls(*(np.asarray(d[k], dtype=np.float64) for k in ("medians", "means", "stds")))


def coverage(obs: Observations, fs: FeatureSet) -> np.ndarray:
    """Fraction of stays in which each channel is observed at least once."""
    if obs.n_stays == 0:
        return np.zeros(fs.n_channels)
    seen = np.zeros((obs.n_stays, fs.n_channels), dtype=bool)
    seen[obs.stay, obs.channel] = True
    return seen.mean(axis=0)
