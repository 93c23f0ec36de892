"""Synthetic ICU stays in the mimic3-benchmarks layout, with a known, learnable signal.

For tests and demos: `write_synthetic(tmp_path, n_train=200, n_test=50)` writes both tasks in
well under a second. Everything is seeded and vectorised over stays.

The signal (`SIGNAL`, also written to `provenance.json`):

- mortality: positives have a rising heart rate (+0.3 bpm per hour, +14 bpm by 48 h), a lower
  pH (-0.06, about 1.2 between-stay SDs), a lower mean BP (-6 mmHg, 0.5 SD), a lower GCS total
  (half of them 8-13 instead of 14-15) and are 5 years older on average.
- phenotypes: label k shifts the stay mean of channel `PHENOTYPE_CHANNELS[k % 10]` by +1 SD
  (k // 10 even) or -1 SD (k // 10 odd); labels are independent, each with the given prevalence.

Values vary between stays (SD in `BASE`) and within a stay (0.4 x that SD); readings are on a
fixed schedule (`SCHEDULE`) with 10% of them left out at random. Everything stays inside the
benchmark's valid ranges, so reading it back drops and clips nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scehr.schemas.featureset import BENCHMARK_STAY, FeatureSet
from scehr.schemas.tasks import task_spec
from scehr.schemas.tensorize import Observations
from scehr.schemas.variables import BY_ID
from scehr.training.data.layout import MORTALITY_LABEL, TASK_DIRS, split_groups
from scehr.training.data.phenotypes import PHENOTYPE_LABELS
from scehr.training.data.writer import (
    write_json,
    write_listfile,
    write_task_listfiles,
    write_timeseries,
)

GENERATOR_VERSION = "1"
#: Subject ids start here, far from MIMIC-III subject ids (< 100000), so no valset matches.
FIRST_SUBJECT = 900_000

#: Continuous channels: (population mean, between-stay SD).
BASE: dict[str, tuple[float, float]] = {
    "heart_rate": (85.0, 12.0), "systolic_bp": (120.0, 18.0), "diastolic_bp": (62.0, 10.0),
    "mean_bp": (80.0, 12.0), "respiratory_rate": (19.0, 4.0), "o2_saturation": (96.5, 1.5),
    "temperature": (37.0, 0.5), "glucose": (135.0, 35.0), "ph": (7.40, 0.05),
    "fio2": (0.40, 0.10), "weight": (80.0, 16.0), "height": (170.0, 10.0),
}
#: Reading schedule: channel -> (interval hours, first reading hours); interval 0 = once.
SCHEDULE: dict[str, tuple[float, float]] = {
    "heart_rate": (1.0, 0.5), "systolic_bp": (1.0, 0.5), "diastolic_bp": (1.0, 0.5),
    "mean_bp": (1.0, 0.5), "respiratory_rate": (1.0, 0.5), "o2_saturation": (1.0, 0.5),
    "temperature": (4.0, 1.0), "glucose": (6.0, 2.0), "ph": (8.0, 3.0), "fio2": (8.0, 3.0),
    "weight": (24.0, 0.0), "height": (0.0, 0.0), "gcs_total": (4.0, 1.0),
    "gcs_eye": (4.0, 1.0), "gcs_motor": (4.0, 1.0), "gcs_verbal": (4.0, 1.0),
    "capillary_refill_rate": (12.0, 2.0),
}
#: Channels the phenotype labels act on (label k -> channel k % 10).
PHENOTYPE_CHANNELS: tuple[str, ...] = (
    "heart_rate", "systolic_bp", "diastolic_bp", "mean_bp", "respiratory_rate",
    "o2_saturation", "temperature", "glucose", "ph", "fio2",
)
SIGNAL: dict[str, Any] = {
    "mortality": {
        "heart_rate_slope_per_hour": 0.3, "ph_shift": -0.06, "mean_bp_shift": -6.0,
        "gcs_total_low_share": 0.5, "age_shift_years": 5.0,
    },
    "phenotypes": {"channels": list(PHENOTYPE_CHANNELS), "shift_sd": 1.0,
                   "rule": "label k: channel k % 10, sign + if (k // 10) even else -"},
    "within_stay_sd_ratio": 0.4, "reading_dropout": 0.1,
}
_WITHIN = 0.4
_DROPOUT = 0.1


def _readings(rng: np.random.Generator, hours: np.ndarray, interval: float, first: float
              ) -> tuple[np.ndarray, np.ndarray]:
    """(stay index, time) of every scheduled reading before each stay's end, 10% dropped."""
    if interval <= 0:
        counts = np.ones(len(hours), dtype=np.int64)
    else:
        counts = np.maximum(np.floor((hours - first) / interval + 1e-9).astype(np.int64) + 1, 0)
    stay = np.repeat(np.arange(len(hours)), counts)
    starts = np.cumsum(counts) - counts
    time = first + max(interval, 0.0) * (np.arange(len(stay)) - starts[stay])
    keep = rng.random(len(stay)) >= _DROPOUT
    if interval <= 0:
        keep[:] = True
    return stay[keep], time[keep]


def _gcs_indices(total: np.ndarray) -> dict[str, np.ndarray]:
    """Category indices of GCS total and plausible matching subscores."""
    lut_total = np.full(16, -1)
    for t in range(3, 16):
        lut_total[t] = BY_ID["gcs_total"].category_index(str(t))
    out = {"gcs_total": lut_total[total]}
    eye = np.where(total >= 13, "4 Spontaneously", np.where(total >= 9, "3 To speech",
                                                             "2 To pain"))
    motor = np.where(total >= 12, "6 Obeys Commands", np.where(total >= 8, "5 Localizes Pain",
                                                                "4 Flex-withdraws"))
    verbal = np.where(total >= 14, "5 Oriented", np.where(total >= 10, "4 Confused",
                                                           "2 Incomp sounds"))
    for vid, names in (("gcs_eye", eye), ("gcs_motor", motor), ("gcs_verbal", verbal)):
        var = BY_ID[vid]
        lut = {c: var.category_index(c) for c in np.unique(names)}
        out[vid] = np.vectorize(lut.__getitem__)(names) if len(names) else names.astype(int)
    return out


def simulate(rng: np.random.Generator, hours: np.ndarray, fs: FeatureSet,
             shift: dict[str, np.ndarray], slope: dict[str, np.ndarray],
             gcs_low: np.ndarray) -> Observations:
    """Observations of len(hours) stays: stay means shifted by `shift`, trends by `slope`."""
    n = len(hours)
    index = {v.id: i for i, v in enumerate(fs.variables)}
    parts: list[tuple[np.ndarray, int, np.ndarray, np.ndarray]] = []
    for vid, (interval, first) in SCHEDULE.items():
        if vid not in index or vid.startswith("gcs_") or vid == "capillary_refill_rate":
            continue
        mean, sd = BASE[vid]
        stay, time = _readings(rng, hours, interval, first)
        level = mean + sd * rng.standard_normal(n) + shift.get(vid, np.zeros(n))
        within = 0.0 if interval <= 0 or vid in ("weight", "height") else _WITHIN * sd
        value = (level[stay] + slope.get(vid, np.zeros(n))[stay] * time
                 + within * rng.standard_normal(len(stay)))
        rng_ = BY_ID[vid].ranges
        lo, hi = (rng_.valid_low, rng_.valid_high) if rng_ else (-np.inf, np.inf)
        parts.append((stay, index[vid], time, np.round(np.clip(value, lo, hi), 3)))
    # GCS: total 14-15 normally, 8-13 for stays flagged low; subscores follow the total.
    stay, time = _readings(rng, hours, *SCHEDULE["gcs_total"])
    total = np.where(gcs_low[stay], rng.integers(8, 14, len(stay)), rng.integers(14, 16,
                                                                                  len(stay)))
    for vid, idx in _gcs_indices(total).items():
        if vid in index:
            parts.append((stay, index[vid], time, idx.astype(np.float64)))
    if "capillary_refill_rate" in index:
        stay, time = _readings(rng, hours, *SCHEDULE["capillary_refill_rate"])
        parts.append((stay, index["capillary_refill_rate"], time,
                      (rng.random(len(stay)) < 0.1).astype(np.float64)))
    stay = np.concatenate([p[0] for p in parts])
    channel = np.concatenate([np.full(len(p[0]), p[1]) for p in parts])
    time = np.concatenate([p[2] for p in parts])
    value = np.concatenate([p[3] for p in parts])
    return Observations(stay, channel, time, value, n)


def _exact_labels(rng: np.random.Generator, n: int, prevalence: float) -> np.ndarray:
    """n binary labels with exactly round(prevalence * n) positives, in random order."""
    y = np.zeros(n, dtype=np.int64)
    y[: round(prevalence * n)] = 1
    return rng.permutation(y)


def _demographics(rng: np.random.Generator, names: list[str], older: np.ndarray
                  ) -> pd.DataFrame:
    n = len(names)
    age = np.clip(rng.normal(64.0, 14.0, n) + older, 18, 95).round()
    sex = (rng.random(n) < 0.56).astype(np.float64)
    age[rng.random(n) < 0.05] = np.nan
    sex[rng.random(n) < 0.03] = np.nan
    return pd.DataFrame({"stay": names, "age": age, "sex_male": sex})


def _write_split(tdir: Path, part: str, names: list[str], obs: Observations,
                 fs: FeatureSet, demo: pd.DataFrame, progress: bool | None) -> None:
    write_timeseries(tdir / part, names, obs, fs, progress=progress, desc=f"synth {part}")
    write_listfile(tdir / part / "demographics.csv", demo)


def _mortality(out: Path, n_train: int, n_test: int, prevalence: float, seed: int,
               val_fraction: float, progress: bool | None) -> dict[str, Any]:
    fs = BENCHMARK_STAY  # all 17 channels; the 48 h window is the reader's business
    tdir = out / TASK_DIRS["mortality"]
    tables = {}
    for part, n, offset in (("train", n_train, 0), ("test", n_test, n_train)):
        rng = np.random.default_rng([seed, 0, offset])
        y = _exact_labels(rng, n, prevalence)
        names = [f"{FIRST_SUBJECT + offset + i}_episode1_timeseries.csv" for i in range(n)]
        s = SIGNAL["mortality"]
        obs = simulate(
            rng, np.full(n, 48.0), fs,
            shift={"ph": s["ph_shift"] * y, "mean_bp": s["mean_bp_shift"] * y},
            slope={"heart_rate": s["heart_rate_slope_per_hour"] * y},
            gcs_low=(y == 1) & (rng.random(n) < s["gcs_total_low_share"]),
        )
        _write_split(tdir, part, names, obs, fs,
                     _demographics(rng, names, s["age_shift_years"] * y), progress)
        tables[part] = pd.DataFrame({"stay": names, "y_true": y})
    train = tables["train"]
    subjects = train["stay"].str.split("_").str[0].to_numpy()
    val = split_groups(subjects, val_fraction, seed, train["y_true"].to_numpy())
    write_task_listfiles(tdir, train, val, tables["test"])
    return {"train": int(n_train - val.sum()), "val": int(val.sum()), "test": n_test,
            "prevalence": prevalence}


def _phenotypes(out: Path, n_train: int, n_test: int, prevalence: float, seed: int,
                val_fraction: float, progress: bool | None) -> dict[str, Any]:
    fs = BENCHMARK_STAY
    tdir = out / TASK_DIRS["phenotypes"]
    tables = {}
    for part, n, offset in (("train", n_train, 0), ("test", n_test, n_train)):
        rng = np.random.default_rng([seed, 1, offset])
        y = np.stack([_exact_labels(rng, n, prevalence) for _ in PHENOTYPE_LABELS], axis=1)
        hours = np.round(rng.uniform(24.0, 120.0, n), 2)
        shift: dict[str, np.ndarray] = {}
        for k in range(len(PHENOTYPE_LABELS)):
            vid = PHENOTYPE_CHANNELS[k % len(PHENOTYPE_CHANNELS)]
            sign = 1.0 if (k // len(PHENOTYPE_CHANNELS)) % 2 == 0 else -1.0
            add = sign * SIGNAL["phenotypes"]["shift_sd"] * BASE[vid][1] * y[:, k]
            shift[vid] = shift.get(vid, np.zeros(n)) + add
        names = [f"{FIRST_SUBJECT + offset + i}_episode1_timeseries.csv" for i in range(n)]
        obs = simulate(rng, hours, fs, shift=shift, slope={}, gcs_low=rng.random(n) < 0.2)
        _write_split(tdir, part, names, obs, fs, _demographics(rng, names, np.zeros(n)),
                     progress)
        table = pd.DataFrame(y, columns=list(PHENOTYPE_LABELS))
        table.insert(0, "period_length", hours)
        table.insert(0, "stay", names)
        tables[part] = table
    train = tables["train"]
    subjects = train["stay"].str.split("_").str[0].to_numpy()
    val = split_groups(subjects, val_fraction, seed)
    write_task_listfiles(tdir, train, val, tables["test"])
    return {"train": int(n_train - val.sum()), "val": int(val.sum()), "test": n_test,
            "prevalence_per_label": prevalence}


#: Task name -> the generator writing its benchmark-layout folder (one per task).
GENERATORS: dict[str, Callable[..., dict[str, Any]]] = {
    "mortality": _mortality, "phenotypes": _phenotypes}


def write_synthetic(out_dir: str | Path, task: str = "both", n_train: int = 200,
                    n_test: int = 50, prevalence: float = 0.2, seed: int = 0, *,
                    val_fraction: float = 0.15, progress: bool | None = False) -> Path:
    """Write a synthetic benchmark-layout dataset under `out_dir`; returns `out_dir`.

    `task` is "mortality", "phenotypes" or "both". `n_train` stays include the validation
    stays (`val_fraction` of them, listed in `val_listfile.csv`). `prevalence` is the exact
    positive share of each split (mortality) or of each label (phenotypes).
    """
    if task != "both" and task not in GENERATORS:
        raise ValueError(f"unknown task {task!r}; expected {', '.join(GENERATORS)} or both")
    if not 0.0 <= prevalence <= 1.0:
        raise ValueError(f"prevalence must be in [0, 1], got {prevalence}")
    if n_train < 1 or n_test < 0:
        raise ValueError("n_train must be >= 1 and n_test >= 0")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    counts: dict[str, Any] = {}
    for name in GENERATORS if task == "both" else (task,):
        counts[name] = GENERATORS[name](out, n_train, n_test, prevalence, seed, val_fraction,
                                        progress)
    write_json(out / "provenance.json", {
        "source": "synthetic (training.data.synthetic)", "generator_version": GENERATOR_VERSION,
        "seed": seed, "counts": counts, "signal": SIGNAL, "label": MORTALITY_LABEL,
    })
    return out


# ---------------------------------------------------------------- example API payloads


def example_payload(task: str = "mortality", seed: int = 7) -> dict[str, Any]:
    """A small long-form `StayPayload` (synthetic) for the API docs, deterministic.

    Mortality: 48 h; phenotypes: 72 h, sparser. Shows units (glucose in mmol/L, temperature in
    Cel, FiO2 in %), category strings and a numeric GCS alias (eye 4 -> "4 Spontaneously").
    """
    rng = np.random.default_rng(seed)
    window = task_spec(task).window_hours
    hours = int(window) if window is not None else 72
    step = 1 if window is not None else 3
    obs: list[dict[str, Any]] = []

    def add(variable: str, t: float, value: Any, unit: str | None = None) -> None:
        o: dict[str, Any] = {"variable": variable, "time": t, "value": value}
        if unit:
            o["unit"] = unit
        obs.append(o)

    add("height", 0.0, 168.0, "cm")
    add("weight", 0.0, 74.5, "kg")
    for h in range(0, hours, step):
        t = h + 0.5
        add("heart_rate", t, round(92 + 0.2 * h + rng.normal(0, 4)))
        add("o2_saturation", t, round(float(np.clip(95 + rng.normal(0, 1.5), 85, 100))))
        if h % (2 * step) == 0:
            sbp = round(118 + rng.normal(0, 8))
            dbp = round(64 + rng.normal(0, 5))
            add("systolic_bp", t, sbp)
            add("diastolic_bp", t, dbp)
            add("mean_bp", t, round((sbp + 2 * dbp) / 3))
            add("respiratory_rate", t, round(20 + rng.normal(0, 3)))
        if h % 4 == 0:
            add("temperature", t, round(37.2 + rng.normal(0, 0.3), 1), "Cel")
        if h % 6 == 0:
            add("glucose", t, round(7.5 + rng.normal(0, 1.0), 1), "mmol/L")
        if h % 8 == 0:
            add("fio2", t, 40, "%")
            add("gcs_eye", t, 4)
            add("gcs_motor", t, "6 Obeys Commands")
            add("gcs_verbal", t, "4 Confused")
            add("gcs_total", t, "14")
        if h % 12 == 0:
            add("ph", t, round(7.36 + rng.normal(0, 0.03), 2))
            add("capillary_refill_rate", t, "0.0")
    stay: dict[str, Any] = {"id": f"example-{task}-1"}
    if window is None:
        stay["end_hours"] = float(hours)  # the stay's length: where phenotypes read up to
    return {**stay, "demographics": {"age": 71, "sex": "female"}, "observations": obs}


def payload_json(payload: dict[str, Any]) -> str:
    """Compact JSON with one observation per line (readable, small)."""
    import json

    head = {k: v for k, v in payload.items() if k != "observations"}
    lines = ",\n    ".join(json.dumps(o) for o in payload["observations"])
    body = json.dumps(head, indent=2)[:-2]
    return f'{body},\n  "observations": [\n    {lines}\n  ]\n}}\n'
