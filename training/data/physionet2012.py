"""PhysioNet/CinC Challenge 2012 -> mimic3-benchmarks `in-hospital-mortality` layout.

Sets a and b become `train/` (15% of their RecordIDs, seeded and stratified by the label, are
listed in `val_listfile.csv`), set c becomes `test/`. Records are read straight from the
tarballs and parsed one set at a time with one `pandas.read_csv` call.

The channels are those of a feature set (`--feature-set`; default `benchmark76-48h`).
Each PhysioNet parameter goes to its own catalog variable where the set has it (the
`physionet2012-full` set has all 37 series, height and the ICU type), else to the coarser
benchmark channel it feeds (`PARAMETER_MAP`); parameters with neither are skipped. For the
benchmark set:

    DiasABP, NIDiasABP -> Diastolic blood pressure   (invasive wins at a shared timestamp)
    SysABP, NISysABP   -> Systolic blood pressure    (invasive wins)
    MAP, NIMAP         -> Mean blood pressure        (invasive wins)
    FiO2               -> Fraction inspired oxygen   (already a fraction)
    GCS                -> Glascow coma scale total   (integer string "3".."15")
    Glucose            -> Glucose (mg/dL)
    HR                 -> Heart Rate
    Height (descriptor, t = 0; -1 = missing) -> Height (cm)
    RespRate           -> Respiratory rate
    SaO2               -> Oxygen saturation (%)
    Temp               -> Temperature (°C)
    Weight (time series, and the descriptor at t = 0; -1 = missing) -> Weight (kg)
    pH                 -> pH

and Capillary refill rate and the GCS eye, motor and verbal subscores stay empty; the labs,
Urine and MechVent are skipped. In `physionet2012-full` the ICU type descriptor is also a
channel at t = 0. Values go through the plausibility rule and the benchmark cleaning rule
(`scehr.schemas.tensorize.clean`), each counted in the provenance.
Rows with an empty parameter name (set c) are dropped. The cleaning rules are applied
before the invasive-wins rule, so a dropped invasive value leaves the non-invasive one in place.
Age, sex (Gender 0 = female, 1 = male), height, weight and ICU type go to `demographics.csv`.
"""

from __future__ import annotations

import io
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from scehr.schemas.featureset import BENCHMARK_48H, FeatureSet
from scehr.schemas.manifest import sha256_file
from scehr.schemas.tensorize import Observations, clean
from scehr.schemas.variables import CategoryError
from scehr.training.data.layout import (
    DEMOGRAPHICS_FILE,
    TASK_DIRS,
    require_source_files,
    split_groups,
)
from scehr.training.data.reader import _split_file
from scehr.training.data.writer import (
    _disable,
    write_json,
    write_listfile,
    write_task_listfiles,
    write_timeseries,
)

CONVERTER_VERSION = "2"
SETS: dict[str, str] = {"a": "train", "b": "train", "c": "test"}
#: What the source folder holds: each set's time series and outcomes.
SOURCE_FILES = tuple([f"set-{s}.tar.gz" for s in SETS] + [f"Outcomes-{s}.txt" for s in SETS])
DESCRIPTORS: tuple[str, ...] = ("RecordID", "Age", "Gender", "Height", "ICUType", "Weight")
#: PhysioNet parameter -> its catalog variable, then the coarser benchmark channel it feeds
#: when the feature set lacks the exact one; each with a priority: the higher wins when two
#: parameters give the same channel at the same time (invasive over non-invasive BP).
PARAMETER_MAP: dict[str, tuple[tuple[str, int], ...]] = {
    "DiasABP": (("invasive_diastolic_bp", 0), ("diastolic_bp", 1)),
    "NIDiasABP": (("noninvasive_diastolic_bp", 0), ("diastolic_bp", 0)),
    "SysABP": (("invasive_systolic_bp", 0), ("systolic_bp", 1)),
    "NISysABP": (("noninvasive_systolic_bp", 0), ("systolic_bp", 0)),
    "MAP": (("invasive_mean_bp", 0), ("mean_bp", 1)),
    "NIMAP": (("noninvasive_mean_bp", 0), ("mean_bp", 0)),
    "SaO2": (("sao2", 0), ("o2_saturation", 0)),
    "FiO2": (("fio2", 0),), "GCS": (("gcs_total", 0),), "Glucose": (("glucose", 0),),
    "HR": (("heart_rate", 0),), "RespRate": (("respiratory_rate", 0),),
    "Temp": (("temperature", 0),), "Weight": (("weight", 0),), "pH": (("ph", 0),),
    "Albumin": (("albumin", 0),), "ALP": (("alp", 0),), "ALT": (("alt", 0),),
    "AST": (("ast", 0),), "Bilirubin": (("bilirubin", 0),), "BUN": (("bun", 0),),
    "Cholesterol": (("cholesterol", 0),), "Creatinine": (("creatinine", 0),),
    "HCO3": (("hco3", 0),), "HCT": (("hematocrit", 0),), "K": (("potassium", 0),),
    "Lactate": (("lactate", 0),), "Mg": (("magnesium", 0),), "Na": (("sodium", 0),),
    "PaCO2": (("paco2", 0),), "PaO2": (("pao2", 0),), "Platelets": (("platelets", 0),),
    "TroponinI": (("troponin_i", 0),), "TroponinT": (("troponin_t", 0),),
    "Urine": (("urine_output", 0),), "WBC": (("wbc", 0),),
    "MechVent": (("mechanical_ventilation", 0),),
}
#: Descriptors that are also channels (observed at t = 0; -1 = missing).
DESCRIPTOR_CHANNELS: dict[str, str] = {"Height": "height", "Weight": "weight",
                                       "ICUType": "icu_type"}


def parameter_targets(fs: FeatureSet) -> dict[str, tuple[str, int]]:
    """PhysioNet parameter -> (channel id, priority) for the parameters `fs` has a place for."""
    ids = set(fs.variable_ids)
    out = {}
    for name, candidates in PARAMETER_MAP.items():
        hit = next(((c, p) for c, p in candidates if c in ids), None)
        if hit is not None:
            out[name] = hit
    return out


def empty_channels(fs: FeatureSet) -> list[str]:
    """Channels of `fs` no PhysioNet parameter or descriptor fills (always missing)."""
    filled = {c for c, _ in parameter_targets(fs).values()} | set(DESCRIPTOR_CHANNELS.values())
    return [v for v in fs.variable_ids if v not in filled]


@dataclass
class SetData:
    """One converted set: cleaned observations, demographics, labels and counts."""

    name: str
    record_ids: np.ndarray
    obs: Observations
    demographics: pd.DataFrame
    labels: np.ndarray
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def stays(self) -> list[str]:
        return [f"{r}_episode1_timeseries.csv" for r in self.record_ids]


def read_records(tar_path: Path, limit: int | None = None, progress: bool | None = None
                 ) -> tuple[np.ndarray, list[bytes]]:
    """(RecordIDs, record bodies without header) of the `.txt` members of a set's tarball."""
    ids: list[int] = []
    bodies: list[bytes] = []
    with tarfile.open(tar_path, "r:gz") as tf:
        bar = tqdm(desc=tar_path.name, unit="record", disable=_disable(progress), leave=False,
                   total=limit)
        for m in tf:
            if not (m.isfile() and m.name.endswith(".txt")):
                continue
            f = tf.extractfile(m)
            assert f is not None
            head, body = _split_file(f.read())
            if head.strip() != b"Time,Parameter,Value":
                raise ValueError(f"{tar_path}:{m.name}: expected the header Time,Parameter,Value")
            ids.append(int(Path(m.name).stem))
            bodies.append(body)
            bar.update()
            if limit is not None and len(ids) >= limit:
                break
        bar.close()
    return np.asarray(ids, dtype=np.int64), bodies


def parse_records(ids: np.ndarray, bodies: list[bytes], fs: FeatureSet = BENCHMARK_48H
                  ) -> tuple[Observations, pd.DataFrame, dict[str, Any]]:
    """Observations (cleaned, invasive BP preferred), demographics and counts of records."""
    n = len(ids)
    counts = np.fromiter((b.count(b"\n") for b in bodies), dtype=np.int64, count=n)
    # Time is HH:MM and is the only field with a colon: split it into two numeric columns.
    text = b"".join(bodies).replace(b":", b",")
    df = pd.read_csv(io.BytesIO(text), header=None, names=["h", "m", "param", "value"],
                     dtype={"h": np.float64, "m": np.float64, "param": str,
                            "value": np.float64},
                     keep_default_na=False, na_values=[""], index_col=False)
    stay = np.repeat(np.arange(n), counts)
    hours = (df["h"] + df["m"] / 60.0).to_numpy()
    value = df["value"].to_numpy()
    # Parameter names as small integer codes (-1 = empty), so every lookup is a numpy take.
    code, names = pd.factorize(df["param"])
    names = [str(x) for x in names]
    name_code = {name: i for i, name in enumerate(names)}
    is_desc = _descriptor_rows(stay, hours, code, [name_code[d] for d in DESCRIPTORS
                                                   if d in name_code])

    demo = {name: np.full(n, np.nan) for name in DESCRIPTORS}
    for name in DESCRIPTORS:
        rows = np.flatnonzero(is_desc & (code == name_code.get(name, -2)))
        demo[name][stay[rows]] = value[rows]
    bad_id = np.flatnonzero(demo["RecordID"] != ids)
    if len(bad_id):
        raise ValueError(f"record {ids[bad_id[0]]}: its RecordID row does not match the file name")
    for name in DESCRIPTORS[1:]:
        demo[name][demo[name] == -1] = np.nan

    empty = code < 0
    series = ~is_desc & ~empty
    index = {v.id: i for i, v in enumerate(fs.variables)}
    targets = parameter_targets(fs)
    # Lookup tables over the codes; the extra last entry serves code -1 (empty name).
    chan_lut = np.array([index[targets[n][0]] if n in targets else np.nan
                         for n in names] + [np.nan])
    prio_lut = np.array([targets[n][1] if n in targets else np.nan
                         for n in names] + [np.nan])
    channel, priority = chan_lut[code], prio_lut[code]
    use = series & ~np.isnan(channel)
    rows = np.flatnonzero(use)
    d_stay, d_channel, d_value, d_row = [stay[rows]], [channel[rows]], [value[rows]], [rows]
    d_time, d_prio = [hours[rows]], [priority[rows]]
    for name, cid in DESCRIPTOR_CHANNELS.items():
        if cid not in index:
            continue
        drow = np.flatnonzero(is_desc & (code == name_code.get(name, -2)))
        drow = drow[~np.isnan(demo[name][stay[drow]])]
        d_stay.append(stay[drow])
        d_channel.append(np.full(len(drow), index[cid]))
        d_value.append(value[drow])
        d_row.append(drow)
        d_time.append(np.zeros(len(drow)))
        d_prio.append(np.zeros(len(drow)))
    cat = [np.concatenate(a) for a in (d_stay, d_channel, d_time, d_value, d_row, d_prio)]
    o_stay, o_channel, o_time, o_value, o_row, o_prio = cat
    o_channel = o_channel.astype(np.int64)
    o_value, invalid_category = _category_indices(o_channel, o_value, fs)
    ok = ~np.isnan(o_value)
    order = np.lexsort((o_row, o_time, o_stay))
    order = order[ok[order]]
    obs = Observations(o_stay[order], o_channel[order], o_time[order], o_value[order], n)
    o_prio = o_prio[order]

    obs, rep = clean(obs, fs)
    keep = np.ones(len(order), dtype=bool)
    keep[rep.removed_rows] = False
    o_prio = o_prio[keep]
    obs, superseded = prefer_invasive(obs, o_prio)

    n_series = np.bincount(stay[series], minlength=n)
    no_ts = ids[n_series == 0]
    ids_ = [v.id for v in fs.variables]
    stats = {
        "stays": n,
        "records_without_timeseries": no_ts.tolist(),
        "rows": len(df),
        "empty_parameter_rows_dropped": int(empty.sum()),
        "unmapped_parameter_rows": int((series & np.isnan(channel)).sum()),
        "invalid_category_dropped": invalid_category,
        "noninvasive_superseded_by_invasive": superseded,
        "same_time_duplicates_last_kept": _duplicates(obs),
        "observations": len(obs),
        "implausible": dict(zip(ids_, rep.implausible.tolist(), strict=True)),
        "rescaled": dict(zip(ids_, rep.rescaled.tolist(), strict=True)),
        "dropped": dict(zip(ids_, rep.dropped.tolist(), strict=True)),
        "clipped": dict(zip(ids_, rep.clipped.tolist(), strict=True)),
    }
    demographics = pd.DataFrame({
        "stay": [f"{r}_episode1_timeseries.csv" for r in ids],
        "age": demo["Age"], "sex_male": demo["Gender"], "height": demo["Height"],
        "weight": demo["Weight"], "icu_type": demo["ICUType"], "record_id": ids,
    })
    return obs, demographics, stats


def _category_indices(channel: np.ndarray, value: np.ndarray, fs: FeatureSet
                      ) -> tuple[np.ndarray, int]:
    """Values with categorical channels' integer codes (GCS 3..15, ICU type 1..4) replaced by
    their category index, NaN where a code is not a category; and how many were not."""
    out = value.astype(np.float64, copy=True)
    bad = 0
    for ch, var in enumerate(fs.variables):
        if not var.is_categorical:
            continue
        rows = np.flatnonzero(channel == ch)
        for v in np.unique(value[rows]):
            hit = rows[value[rows] == v]
            try:
                out[hit] = var.category_index(float(v))
            except CategoryError:
                out[hit] = np.nan
                bad += len(hit)
    return out, bad


def _descriptor_rows(stay: np.ndarray, hours: np.ndarray, code: np.ndarray,
                     descriptor_codes: list[int]) -> np.ndarray:
    """Rows that are a record's descriptors: the first 00:00 row of each descriptor name.

    Descriptors usually open a record, but in about 2% of files they are interleaved with
    00:00 measurements (e.g. `Age, ICUType, pH, Gender`), so position cannot decide. Weight is
    both a descriptor and a series: its first 00:00 row is the descriptor, later rows series.
    """
    cand = np.flatnonzero((hours == 0) & np.isin(code, descriptor_codes))
    key = stay[cand] * (int(code.max(initial=0)) + 1) + code[cand]
    _, first = np.unique(key, return_index=True)  # rows are in file order within a stay
    out = np.zeros(len(code), dtype=bool)
    out[cand[first]] = True
    return out


def _cell_key(obs: Observations) -> np.ndarray:
    """One int64 per (stay, channel, time to the second)."""
    seconds = np.round(obs.time * 3600).astype(np.int64)
    n_channels = int(obs.channel.max()) + 1 if len(obs) else 1
    return (obs.stay * n_channels + obs.channel) * (int(seconds.max(initial=0)) + 1) + seconds


def prefer_invasive(obs: Observations, priority: np.ndarray) -> tuple[Observations, int]:
    """Drop non-invasive values (priority 0) where an invasive one (1) shares stay/time/channel."""
    key = _cell_key(obs)
    high = priority == 1
    drop = (priority == 0) & np.isin(key, key[high])
    return obs.take(~drop), int(drop.sum())


def _duplicates(obs: Observations) -> int:
    """Values sharing (stay, time, channel) with another: the file keeps only the last one."""
    if len(obs) == 0:
        return 0
    key = np.sort(_cell_key(obs))
    return int((key[1:] == key[:-1]).sum())


def read_outcomes(path: Path, ids: np.ndarray) -> np.ndarray:
    """`In-hospital_death` (0/1) for each RecordID."""
    out = pd.read_csv(path)
    if "RecordID" not in out.columns or "In-hospital_death" not in out.columns:
        raise ValueError(f"{path}: expected columns RecordID,...,In-hospital_death")
    label = out.set_index("RecordID")["In-hospital_death"].reindex(ids)
    if label.isna().any():
        raise ValueError(f"{path}: no outcome for RecordID {ids[label.isna().to_numpy()][0]}")
    return label.to_numpy(dtype=np.int64)


def read_set(src: Path, name: str, *, limit: int | None = None,
             progress: bool | None = None, fs: FeatureSet = BENCHMARK_48H) -> SetData:
    """Read, map and clean one set (`a`, `b` or `c`)."""
    ids, bodies = read_records(src / f"set-{name}.tar.gz", limit, progress)
    obs, demo, stats = parse_records(ids, bodies, fs)
    y = read_outcomes(src / f"Outcomes-{name}.txt", ids)
    stats["positives"] = int(y.sum())
    stats["positive_rate"] = float(y.mean()) if len(y) else 0.0
    return SetData(name, ids, obs, demo, y, stats)


def _concat(sets: list[SetData]) -> tuple[Observations, list[str], pd.DataFrame, np.ndarray]:
    offset = 0
    parts = []
    for s in sets:
        o = s.obs
        parts.append((o.stay + offset, o.channel, o.time, o.value))
        offset += o.n_stays
    obs = Observations(*(np.concatenate(a) for a in zip(*parts, strict=True)), offset)
    names = [n for s in sets for n in s.stays]
    demo = pd.concat([s.demographics for s in sets], ignore_index=True)
    return obs, names, demo, np.concatenate([s.labels for s in sets])


def convert_physionet2012(src: str | Path, out: str | Path, *, limit: int | None = None,
                          seed: int = 0, val_fraction: float = 0.15,
                          progress: bool | None = None,
                          fs: FeatureSet = BENCHMARK_48H) -> dict[str, Any]:
    """Convert the three sets into feature set `fs`'s channels; returns the provenance (also
    written to `provenance.json`, which names the feature set).

    `limit` keeps only the first `limit` records of each set (for tests).
    """
    t0 = time.perf_counter()
    src, out = Path(src).expanduser(), Path(out).expanduser()
    require_source_files(src, SOURCE_FILES, "PhysioNet 2012")
    sets = {name: read_set(src, name, limit=limit, progress=progress, fs=fs) for name in SETS}
    tdir = out / TASK_DIRS["mortality"]
    tables = {}
    val_mask = np.zeros(0, dtype=bool)
    for part in ("train", "test"):
        members = [sets[n] for n, p in SETS.items() if p == part]
        obs, names, demo, y = _concat(members)
        write_timeseries(tdir / part, names, obs, fs, progress=progress, desc=f"write {part}")
        write_listfile(tdir / part / DEMOGRAPHICS_FILE, demo)
        tables[part] = pd.DataFrame({"stay": names, "y_true": y})
        if part == "train":
            rid = demo["record_id"].astype(str).to_numpy()
            val_mask = split_groups(rid, val_fraction, seed, y)
    write_task_listfiles(tdir, tables["train"], val_mask, tables["test"])
    train_y = tables["train"]["y_true"].to_numpy()
    splits = {
        "train": {"stays": int((~val_mask).sum()), "positives": int(train_y[~val_mask].sum())},
        "val": {"stays": int(val_mask.sum()), "positives": int(train_y[val_mask].sum())},
        "test": {"stays": len(tables["test"]),
                 "positives": int(tables["test"]["y_true"].sum())},
    }
    for d in splits.values():
        d["positive_rate"] = d["positives"] / d["stays"] if d["stays"] else 0.0
    provenance = {
        "source": "PhysioNet/CinC Challenge 2012 (physionet.org challenge-2012 v1.0.0, ODC-By)",
        "source_dir": str(src.resolve()),
        "source_sha256": {p.name: sha256_file(p) for p in sorted(src.glob("*")) if p.is_file()
                          and (p.name.startswith("set-") or p.name.startswith("Outcomes-"))},
        "converter": "scehr.training.data.physionet2012", "converter_version": CONVERTER_VERSION,
        "task": TASK_DIRS["mortality"], "label": "In-hospital_death",
        "sets": {n: {"split": SETS[n], **s.stats} for n, s in sets.items()},
        "splits": splits,
        "validation": {"fraction": val_fraction, "seed": seed,
                       "by": "RecordID, stratified by label"},
        "limit_per_set": limit,
        "feature_set": {"name": fs.name, "version": fs.version, "sha256": fs.sha256},
        "mapping": {p: c for p, (c, _) in parameter_targets(fs).items()}
        | {f"{d} (descriptor)": c for d, c in DESCRIPTOR_CHANNELS.items()
           if c in fs.variable_ids},
        "empty_channels": empty_channels(fs),
        "seconds": round(time.perf_counter() - t0, 2),
    }
    write_json(out / "provenance.json", provenance)
    return provenance
