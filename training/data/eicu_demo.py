"""eICU demo -> mimic3-benchmarks `phenotyping` and `in-hospital-mortality` layouts.

Sources (under SRC = `eicu-demo/`): the YAIB hourly grid `derived-yaib-hourly/
los_eicu_demo_{dyn,sta}.parquet` (vitals and labs, 0-7 days), `patient.csv.gz` (stay length,
discharge status, demographics) and `diagnosis.csv.gz` (ICD-9 codes for the phenotypes).

Channel mapping (YAIB grid column -> benchmark channel; units measured on the demo):

    hr    -> Heart Rate (/min)                sbp   -> Systolic blood pressure (mmHg)
    dbp   -> Diastolic blood pressure (mmHg)  map   -> Mean blood pressure (mmHg)
    o2sat -> Oxygen saturation (%)            resp  -> Respiratory rate (/min)
    temp  -> Temperature (°C, 32-40.6)        glu   -> Glucose (mg/dL, 10-975)
    ph    -> pH                               fio2  -> Fraction inspired oxygen: the grid holds
                                                       percent (21-100), divided by 100
    sta.height / sta.weight (else patient.admissionheight / admissionweight) -> Height (cm),
                                                       Weight (kg), observed at t = 0

Always empty: Capillary refill rate and the four GCS channels (the grid has no GCS).

With `--feature-set physionet2012-full` the labs map onto the same catalog ids as PhysioNet's
(alb -> albumin, alp, alt, ast, bicar -> hco3, bili -> bilirubin, bun, crea -> creatinine,
k -> potassium, lact -> lactate, mg -> magnesium, na -> sodium, pco2 -> paco2, po2 -> pao2,
plt -> platelets, tnt -> troponin_t, urine -> urine_output, wbc; units as the catalog's
canonical ones, checked on the demo's ranges), sbp/dbp/map to the non-invasive pressures
(the grid merges both kinds), `patient.unittype` to the ICU type where it is one of
PhysioNet's four (Cardiac ICU, CSICU/CTICU, MICU, SICU; mixed units stay missing). No
PhysioNet counterpart on the grid: GCS, SaO2 (o2sat is mostly pulse oximetry, `spo2`, which
the full set lacks), invasive pressures, hematocrit, cholesterol, troponin I, ventilation.

Time: a grid row for hour h summarises [h, h+1), so it is stamped at min(h + 1, stay end): it
lands in benchmark bin h and is never seen before it was measured. Rows with h >= the stay's
length (after discharge) are dropped. The grid stops at 7 days; longer stays carry their last
values forward to the end (`period_length`, capped at 240 h by the reader).

Cohorts: phenotyping keeps stays with at least one observation and at least one ICD-9 code
(stays without any are excluded, not labelled all-negative); `period_length` = ICU length of
stay (unitdischargeoffset / 60). In-hospital mortality keeps stays of at least 48 h with a known
hospitaldischargestatus (Expired = 1, Alive = 0) and an observation in the first 48 h, and
writes their first 48 h. Splits are drawn once, seeded, for both tasks: 20% test, then 15% of
the rest validation. By default the units drawn are patients (`uniquepid`: all stays of a
patient on one side), as a single site would split its own data; with `split_by="hospital"`
they are hospitals (`hospitalid`, joined with any hospital that shares a patient with it), so
test and validation hospitals are ones training never saw: the split for training on this site
together with another dataset and testing on hospitals of neither (docs/robustness.md).
Stay files are `<uniquepid>_episode<k>_timeseries.csv`, k numbering the patient's ICU stays.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scehr.schemas.featureset import BENCHMARK_STAY, FeatureSet
from scehr.schemas.manifest import sha256_file
from scehr.schemas.tensorize import Observations, clean
from scehr.training.data.layout import (
    DEMOGRAPHICS_FILE,
    TASK_DIRS,
    require_source_files,
    split_groups,
)
from scehr.training.data.phenotypes import (
    benchmark_groups,
    icd9_long,
    label_matrix,
    load_ccs_definitions,
)
from scehr.training.data.writer import (
    write_json,
    write_listfile,
    write_task_listfiles,
    write_timeseries,
)

CONVERTER_VERSION = "2"
DYN = "derived-yaib-hourly/los_eicu_demo_dyn.parquet"
STA = "derived-yaib-hourly/los_eicu_demo_sta.parquet"
SOURCES = ("patient.csv.gz", "diagnosis.csv.gz", DYN, STA)
#: YAIB grid column -> (catalog variables in preference order, factor to the canonical unit);
#: the first the feature set has is used. The grid merges invasive and non-invasive pressures
#: (mostly non-invasive on the demo), and its o2sat is mostly pulse oximetry (SpO2).
GRID_MAP: dict[str, tuple[tuple[str, ...], float]] = {
    "hr": (("heart_rate",), 1.0),
    "sbp": (("systolic_bp", "noninvasive_systolic_bp"), 1.0),
    "dbp": (("diastolic_bp", "noninvasive_diastolic_bp"), 1.0),
    "map": (("mean_bp", "noninvasive_mean_bp"), 1.0),
    "o2sat": (("o2_saturation", "spo2"), 1.0),
    "resp": (("respiratory_rate",), 1.0), "temp": (("temperature",), 1.0),
    "fio2": (("fio2",), 0.01), "glu": (("glucose",), 1.0), "ph": (("ph",), 1.0),
    "alb": (("albumin",), 1.0), "alp": (("alp",), 1.0), "alt": (("alt",), 1.0),
    "ast": (("ast",), 1.0), "bicar": (("hco3",), 1.0), "bili": (("bilirubin",), 1.0),
    "bun": (("bun",), 1.0), "crea": (("creatinine",), 1.0), "k": (("potassium",), 1.0),
    "lact": (("lactate",), 1.0), "mg": (("magnesium",), 1.0), "na": (("sodium",), 1.0),
    "pco2": (("paco2",), 1.0), "po2": (("pao2",), 1.0), "plt": (("platelets",), 1.0),
    "tnt": (("troponin_t",), 1.0), "urine": (("urine_output",), 1.0),
    "wbc": (("wbc",), 1.0),
}
#: eICU `patient.unittype` -> PhysioNet's ICU type (mixed units, e.g. Med-Surg, stay missing).
UNIT_TYPES: dict[str, str] = {"Cardiac ICU": "1", "CSICU": "2", "CTICU": "2", "MICU": "3",
                              "SICU": "4"}


def grid_targets(fs: FeatureSet) -> dict[str, tuple[str, float]]:
    """Grid column -> (channel id, factor) for the columns `fs` has a place for."""
    ids = set(fs.variable_ids)
    out = {}
    for col, (candidates, factor) in GRID_MAP.items():
        hit = next((c for c in candidates if c in ids), None)
        if hit is not None:
            out[col] = (hit, factor)
    return out


STATIC_CHANNELS: tuple[str, ...] = ("height", "weight", "icu_type")


def empty_channels(fs: FeatureSet) -> list[str]:
    """Channels of `fs` the demo never fills."""
    filled = {c for c, _ in grid_targets(fs).values()} | set(STATIC_CHANNELS)
    return [v for v in fs.variable_ids if v not in filled]


TEST_FRACTION = 0.2
VAL_FRACTION = 0.15
MORTALITY_HOURS = 48.0


def grid_time(hour: np.ndarray, end_hours: np.ndarray) -> np.ndarray:
    """Time stamp of a grid value summarising [hour, hour + 1): min(hour + 1, stay end)."""
    return np.minimum(np.asarray(hour, dtype=np.float64) + 1.0, end_hours)


def parse_age(age: pd.Series) -> np.ndarray:
    """eICU ages are text; "> 89" becomes 90, empty becomes NaN."""
    text = age.astype("string").str.strip()
    text = text.mask((text == "> 89").fillna(False), "90")
    return pd.to_numeric(text, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def read_stays(src: Path, limit_patients: int | None = None) -> pd.DataFrame:
    """One row per ICU stay with its benchmark name, length and demographics."""
    p = pd.read_csv(src / "patient.csv.gz")
    if limit_patients is not None:
        keep = np.sort(p["uniquepid"].unique())[:limit_patients]
        p = p[p["uniquepid"].isin(keep)]
    p = p.sort_values(["uniquepid", "patienthealthsystemstayid", "unitvisitnumber",
                       "patientunitstayid"]).reset_index(drop=True)
    episode = p.groupby("uniquepid").cumcount() + 1
    sta = pd.read_parquet(src / STA).set_index("stay_id")
    sta = sta.reindex(p["patientunitstayid"].to_numpy())
    sex = p["gender"].map({"Male": 1.0, "Female": 0.0})
    return pd.DataFrame({
        "stay": p["uniquepid"] + "_episode" + episode.astype(str) + "_timeseries.csv",
        "age": parse_age(p["age"]),
        "sex_male": sex.to_numpy(dtype=np.float64, na_value=np.nan),
        "height": sta["height"].fillna(pd.Series(p["admissionheight"].to_numpy(),
                                                 index=sta.index)).to_numpy(),
        "weight": sta["weight"].fillna(pd.Series(p["admissionweight"].to_numpy(),
                                                 index=sta.index)).to_numpy(),
        "patientunitstayid": p["patientunitstayid"].to_numpy(),
        "uniquepid": p["uniquepid"].to_numpy(),
        "hospitalid": p["hospitalid"].to_numpy(),
        "los_hours": p["unitdischargeoffset"].to_numpy(dtype=np.float64) / 60.0,
        "status": p["hospitaldischargestatus"].to_numpy(dtype=object),
        "unittype": p["unittype"].to_numpy(dtype=object),
    })


SPLIT_UNITS = ("patient", "hospital")


def hospital_groups(hospitals: np.ndarray, patients: np.ndarray) -> np.ndarray:
    """Per stay, its group of hospitals: hospitals sharing a patient are joined (connected
    components), so a split by group keeps every hospital and every patient on one side."""
    parent: dict[str, str] = {h: h for h in np.unique(hospitals.astype(str))}

    def root(h: str) -> str:
        while parent[h] != h:
            parent[h] = parent[parent[h]]
            h = parent[h]
        return h

    first: dict[str, str] = {}
    for h, p in zip(hospitals.astype(str), patients.astype(str), strict=True):
        if p in first:
            parent[root(h)] = root(first[p])
        else:
            first[p] = h
    return np.array([root(h) for h in hospitals.astype(str)])


def split_masks(stays: pd.DataFrame, split_by: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(is_test, is_val) per stay, drawn by patient or by hospital group."""
    if split_by not in SPLIT_UNITS:
        raise ValueError(f"split_by must be one of {', '.join(SPLIT_UNITS)}, not {split_by!r}")
    pids = stays["uniquepid"].to_numpy(dtype=str)
    units = (pids if split_by == "patient"
             else hospital_groups(stays["hospitalid"].to_numpy(), pids))
    is_test = split_groups(units, TEST_FRACTION, seed)
    is_val = np.zeros(len(units), dtype=bool)
    is_val[~is_test] = split_groups(units[~is_test], VAL_FRACTION, seed + 1)
    return is_test, is_val


def grid_observations(src: Path, stays: pd.DataFrame, fs: FeatureSet
                      ) -> tuple[Observations, dict[str, Any]]:
    """Observations of all stays from the hourly grid plus height/weight at t = 0 (uncleaned)."""
    index = {v.id: i for i, v in enumerate(fs.variables)}
    targets = grid_targets(fs)
    dyn = pd.read_parquet(src / DYN, columns=["stay_id", "time", *targets])
    pos = pd.Series(np.arange(len(stays)), index=stays["patientunitstayid"].to_numpy())
    stay = dyn["stay_id"].map(pos).to_numpy(dtype=np.float64, na_value=np.nan)
    dyn = dyn[~np.isnan(stay)]
    stay = stay[~np.isnan(stay)].astype(np.int64)
    hour = (dyn["time"].dt.total_seconds().to_numpy() / 3600.0).astype(np.float64)
    los = stays["los_hours"].to_numpy()[stay]
    after = hour >= los
    t = grid_time(hour, los)
    parts = []
    for col, (cid, factor) in targets.items():
        v = dyn[col].to_numpy(dtype=np.float64) * factor
        ok = ~np.isnan(v) & ~after
        parts.append((stay[ok], np.full(ok.sum(), index[cid]), t[ok], v[ok]))
    for col in STATIC_CHANNELS:
        if col not in index:
            continue
        if col == "icu_type":
            cats = fs.variables[index[col]].categories
            v = stays["unittype"].map({u: float(cats.index(c)) for u, c in UNIT_TYPES.items()})
            v = v.to_numpy(dtype=np.float64, na_value=np.nan)
        else:
            v = stays[col].to_numpy(dtype=np.float64)
        ok = np.flatnonzero(~np.isnan(v))
        parts.append((ok, np.full(len(ok), index[col]), np.zeros(len(ok)), v[ok]))
    s, c, tt, vv = (np.concatenate(a) for a in zip(*parts, strict=True))
    order = np.lexsort((c, tt, s))
    obs = Observations(s[order], c[order], tt[order], vv[order], len(stays))
    stats = {"grid_rows": len(dyn), "grid_rows_after_discharge_dropped": int(after.sum()),
             "stays_in_grid": len(np.unique(stay))}
    return obs, stats


def subset(obs: Observations, keep_stay: np.ndarray, max_time: float | None = None
           ) -> Observations:
    """The observations of the kept stays (renumbered), optionally up to `max_time` hours."""
    new_index = np.cumsum(keep_stay) - 1
    rows = keep_stay[obs.stay]
    if max_time is not None:
        rows &= obs.time <= max_time + 1e-6
    out = obs.take(rows)
    out.stay = new_index[out.stay]
    out.n_stays = int(keep_stay.sum())
    return out


def _write_task(tdir: Path, obs: Observations, stays: pd.DataFrame, table: pd.DataFrame,
                keep: np.ndarray, part_of: np.ndarray, val: np.ndarray, fs: FeatureSet,
                max_time: float | None, progress: bool | None) -> dict[str, pd.DataFrame]:
    """Write train/ and test/ of one task for the kept stays; returns the listfile tables."""
    demo_cols = ["stay", "age", "sex_male", "height", "weight", "patientunitstayid",
                 "uniquepid", "hospitalid"]
    tables = {}
    for part in ("train", "test"):
        sel = keep & (part_of == part)
        sub = subset(obs, sel, max_time)
        write_timeseries(tdir / part, stays["stay"][sel].tolist(), sub, fs, progress=progress,
                         desc=f"{tdir.name} {part}")
        write_listfile(tdir / part / DEMOGRAPHICS_FILE, stays.loc[sel, demo_cols])
        tables[part] = table[sel].reset_index(drop=True)
    write_task_listfiles(tdir, tables["train"], val[keep & (part_of == "train")], tables["test"])
    return tables


def convert_eicu_demo(src: str | Path, out: str | Path, *, ccs_definitions: str | Path |
                      None = None, limit_patients: int | None = None, seed: int = 0,
                      progress: bool | None = None,
                      fs: FeatureSet = BENCHMARK_STAY, split_by: str = "patient"
                      ) -> dict[str, Any]:
    """Convert the eICU demo into feature set `fs`'s channels (both tasks); returns the
    provenance (also written to `provenance.json`, which names the feature set)."""
    t0 = time.perf_counter()
    src, out = Path(src).expanduser(), Path(out).expanduser()
    require_source_files(src, SOURCES, "eICU demo")
    definitions = load_ccs_definitions(ccs_definitions)
    groups = benchmark_groups(definitions)
    stays = read_stays(src, limit_patients)
    n = len(stays)
    raw, grid_stats = grid_observations(src, stays, fs)
    obs, rep = clean(raw, fs)
    # Height/weight alone at t = 0 are not a time series: count stays with grid values.
    grid_channels = [i for i, v in enumerate(fs.variables) if v.id not in STATIC_CHANNELS]
    is_grid = np.isin(obs.channel, grid_channels)
    has_grid = np.bincount(obs.stay[is_grid], minlength=n) > 0
    early = is_grid & (obs.time <= MORTALITY_HOURS + 1e-6)
    has_48 = np.bincount(obs.stay[early], minlength=n) > 0

    diag = pd.read_csv(src / "diagnosis.csv.gz", usecols=["patientunitstayid", "icd9code"])
    pos = pd.Series(np.arange(n), index=stays["patientunitstayid"].to_numpy())
    dstay = diag["patientunitstayid"].map(pos)
    diag = diag[dstay.notna().to_numpy()]
    code_stay, codes = icd9_long(dstay.dropna().to_numpy(dtype=np.int64), diag["icd9code"])
    has_icd9 = np.bincount(code_stay, minlength=n) > 0
    y_pheno = label_matrix(code_stay, codes, n, definitions)

    pids = stays["uniquepid"].to_numpy(dtype=str)
    is_test, is_val = split_masks(stays, split_by, seed)
    part_of = np.where(is_test, "test", "train")

    los = stays["los_hours"].to_numpy()
    status = stays["status"]
    known = status.isin(["Alive", "Expired"]).to_numpy()
    keep_ph = has_grid & has_icd9
    keep_ihm = (los >= MORTALITY_HOURS) & known & has_48

    pheno_table = pd.DataFrame(y_pheno, columns=list(groups))
    pheno_table.insert(0, "period_length", los)
    pheno_table.insert(0, "stay", stays["stay"].to_numpy())
    ihm_table = pd.DataFrame({"stay": stays["stay"].to_numpy(),
                              "y_true": (status == "Expired").to_numpy(dtype=np.int64)})
    _write_task(out / TASK_DIRS["phenotypes"], obs, stays, pheno_table, keep_ph, part_of,
                is_val, fs, None, progress)
    _write_task(out / TASK_DIRS["mortality"], obs, stays, ihm_table, keep_ihm, part_of,
                is_val, fs, MORTALITY_HOURS, progress)

    ids = [v.id for v in fs.variables]

    def counts(keep: np.ndarray, y: np.ndarray, names: list[str]) -> dict[str, Any]:
        res = {}
        for split, m in (("train", ~is_test & ~is_val), ("val", is_val), ("test", is_test)):
            sel = keep & m
            prev = y[sel].mean(axis=0) if sel.any() else np.zeros(y.shape[1])
            res[split] = {"stays": int(sel.sum()), "patients": len(np.unique(pids[sel])),
                          "hospitals": len(np.unique(stays["hospitalid"].to_numpy()[sel])),
                          "positives": dict(zip(names, y[sel].sum(axis=0).tolist(),
                                                strict=True)),
                          "prevalence": dict(zip(names, np.round(prev, 4).tolist(),
                                                 strict=True))}
        return res

    provenance = {
        "source": "eICU Collaborative Research Database Demo v2.0.1 (ODbL) + YAIB hourly grid",
        "source_dir": str(src.resolve()),
        "source_sha256": {name: sha256_file(src / name) for name in SOURCES},
        "converter": "scehr.training.data.eicu_demo", "converter_version": CONVERTER_VERSION,
        "seed": seed, "limit_patients": limit_patients,
        "split": {"by": "uniquepid" if split_by == "patient" else "hospitalid",
                  "test_fraction": TEST_FRACTION,
                  "val_fraction_of_train": VAL_FRACTION},
        "stays_in_patient_table": n,
        "stays_with_grid_data": int(has_grid.sum()),
        "stays_with_icd9": int(has_icd9.sum()),
        "icd9_codes": len(codes), "distinct_icd9_codes": len(np.unique(codes)),
        **grid_stats,
        "phenotyping": {
            "kept": int(keep_ph.sum()),
            "excluded_no_grid_data": int((~has_grid).sum()),
            "excluded_no_icd9_code": int((has_grid & ~has_icd9).sum()),
            "label_order": "benchmark listfile order: sorted CCS group names",
            "splits": counts(keep_ph, y_pheno, list(groups)),
        },
        "in_hospital_mortality": {
            "kept": int(keep_ihm.sum()),
            "stays_48h_or_longer": int((los >= MORTALITY_HOURS).sum()),
            "excluded_status_unknown": int(((los >= MORTALITY_HOURS) & ~known).sum()),
            "excluded_no_data_in_48h": int(((los >= MORTALITY_HOURS) & known
                                             & ~has_48).sum()),
            "splits": counts(keep_ihm, ihm_table[["y_true"]].to_numpy(), ["y_true"]),
        },
        "feature_set": {"name": fs.name, "version": fs.version, "sha256": fs.sha256},
        "cleaning": {"implausible": dict(zip(ids, rep.implausible.tolist(), strict=True)),
                     "rescaled": dict(zip(ids, rep.rescaled.tolist(), strict=True)),
                     "dropped": dict(zip(ids, rep.dropped.tolist(), strict=True)),
                     "clipped": dict(zip(ids, rep.clipped.tolist(), strict=True))},
        "mapping": {k: c for k, (c, _) in grid_targets(fs).items()}
        | {"sta.height / patient.admissionheight": "height",
           "sta.weight / patient.admissionweight": "weight",
           "patient.unittype": "icu_type"},
        "unit_conversions": {"fio2": "percent / 100 -> fraction"},
        "empty_channels": empty_channels(fs),
        "seconds": round(time.perf_counter() - t0, 2),
    }
    write_json(out / "provenance.json", provenance)
    return provenance
