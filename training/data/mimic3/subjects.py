"""The benchmark's cohort: ICU stays with their admission and patient, and their diagnoses.

The reference's `extract_subjects` rules, in its order: drop ICU stays with a ward or care-unit
transfer, keep admissions with exactly one remaining ICU stay, compute age at ICU admission
(ages below 0, the shifted dates of patients over 89, become 90) and in-unit / in-hospital
mortality, keep adults (age >= 18). These tables are small (about 60,000 stays in MIMIC-III), so
pandas does them; the event tables go through DuckDB (`events`).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scehr.training.data.mimic3.filewriter import FileWriter
from scehr.training.data.mimic3.sources import read_small

STAY_COLUMNS = ["SUBJECT_ID", "HADM_ID", "ICUSTAY_ID", "LAST_CAREUNIT", "DBSOURCE", "INTIME",
                "OUTTIME", "LOS", "ADMITTIME", "DISCHTIME", "DEATHTIME", "ETHNICITY", "DIAGNOSIS",
                "GENDER", "DOB", "DOD", "AGE", "MORTALITY_INUNIT", "MORTALITY",
                "MORTALITY_INHOSPITAL"]
DIAGNOSIS_COLUMNS = ["SUBJECT_ID", "HADM_ID", "SEQ_NUM", "ICD9_CODE", "SHORT_TITLE", "LONG_TITLE",
                     "ICUSTAY_ID"]
TIME_COLUMNS = ["INTIME", "OUTTIME", "ADMITTIME", "DISCHTIME", "DEATHTIME", "DOB", "DOD"]


@dataclass
class Cohort:
    """Stays (one row per kept ICU stay) and their diagnoses with HCUP CCS groups (in the row
    order of the reference's all_diagnoses.csv)."""

    stays: pd.DataFrame
    diagnoses: pd.DataFrame
    counts: dict[str, dict[str, int]]


def _time(s: pd.Series) -> list[datetime | None]:
    return [None if v is None else datetime.fromisoformat(v) for v in s]


def _ids(stays: pd.DataFrame) -> dict[str, int]:
    return {"icu_stays": int(stays.ICUSTAY_ID.nunique()),
            "admissions": int(stays.HADM_ID.nunique()), "subjects": int(stays.SUBJECT_ID.nunique())}


def _between(t: list, lo: list, hi: list, index: pd.Index) -> pd.Series:
    return pd.Series([x is not None and a <= x <= b for x, a, b in zip(t, lo, hi, strict=True)],
                     index=index)


def read_cohort(mimic_dir: Path, definitions: dict[str, Any]) -> Cohort:
    """The kept stays and their diagnoses, with the reference's filters and columns."""
    pats = read_small(mimic_dir, "PATIENTS", ["SUBJECT_ID", "GENDER", "DOB", "DOD"])
    admits = read_small(mimic_dir, "ADMISSIONS", ["SUBJECT_ID", "HADM_ID", "ADMITTIME",
                                                   "DISCHTIME", "DEATHTIME", "ETHNICITY",
                                                   "DIAGNOSIS"])
    stays = read_small(mimic_dir, "ICUSTAYS", ["SUBJECT_ID", "HADM_ID", "ICUSTAY_ID", "DBSOURCE",
                                               "FIRST_CAREUNIT", "LAST_CAREUNIT", "FIRST_WARDID",
                                               "LAST_WARDID", "INTIME", "OUTTIME", "LOS"])
    for df in (pats, admits, stays):
        for c in ("SUBJECT_ID", "HADM_ID", "ICUSTAY_ID"):
            if c in df:
                df[c] = df[c].astype(int)
    counts = {"start": _ids(stays)}
    same_ward = [a is not None and a == b and float(a) == float(b)
                 for a, b in zip(stays.FIRST_WARDID, stays.LAST_WARDID, strict=True)]
    same_unit = [a is not None and a == b
                 for a, b in zip(stays.FIRST_CAREUNIT, stays.LAST_CAREUNIT, strict=True)]
    stays = stays[pd.Series(same_ward, index=stays.index) & pd.Series(same_unit, index=stays.index)]
    stays = stays[["SUBJECT_ID", "HADM_ID", "ICUSTAY_ID", "LAST_CAREUNIT", "DBSOURCE", "INTIME",
                   "OUTTIME", "LOS"]]
    counts["no_transfers"] = _ids(stays)
    stays = stays.merge(admits, on=["SUBJECT_ID", "HADM_ID"]).merge(pats, on="SUBJECT_ID")
    per_adm = stays.groupby("HADM_ID").ICUSTAY_ID.transform("count")
    stays = stays[per_adm == 1].copy()
    counts["one_stay_per_admission"] = _ids(stays)
    t = {c: _time(stays[c]) for c in TIME_COLUMNS}
    age = [(a - b).total_seconds() / 3600.0 / 24.0 / 365.0
           for a, b in zip(t["INTIME"], t["DOB"], strict=True)]
    stays["AGE"] = [90.0 if a < 0 else a for a in age]
    ix = stays.index
    unit = (_between(t["DOD"], t["INTIME"], t["OUTTIME"], ix)
            | _between(t["DEATHTIME"], t["INTIME"], t["OUTTIME"], ix))
    hosp = (_between(t["DOD"], t["ADMITTIME"], t["DISCHTIME"], ix)
            | _between(t["DEATHTIME"], t["ADMITTIME"], t["DISCHTIME"], ix))
    stays["MORTALITY_INUNIT"] = unit.astype(int)
    stays["MORTALITY"] = hosp.astype(int)
    stays["MORTALITY_INHOSPITAL"] = stays["MORTALITY"]
    stays = stays[stays.AGE >= 18]
    counts["adults"] = _ids(stays)
    for c in TIME_COLUMNS:  # written back the way pandas writes datetimes
        stays[c] = [None if v is None else v.strftime("%Y-%m-%d %H:%M:%S")
                    for v in _time(stays[c])]
    stays["LOS"] = [None if v is None else float(v) for v in stays.LOS]
    stays = stays.sort_values(["SUBJECT_ID", "INTIME", "ICUSTAY_ID"], kind="stable")
    stays = stays[STAY_COLUMNS].reset_index(drop=True)
    return Cohort(stays=stays, diagnoses=_diagnoses(mimic_dir, stays, definitions),
                  counts=counts)


def _diagnoses(mimic_dir: Path, stays: pd.DataFrame, definitions: dict[str, Any]
               ) -> pd.DataFrame:
    """The kept stays' coded diagnoses, in the row order of the reference's all_diagnoses.csv."""
    codes = read_small(mimic_dir, "D_ICD_DIAGNOSES", ["ICD9_CODE", "SHORT_TITLE", "LONG_TITLE"])
    dx = read_small(mimic_dir, "DIAGNOSES_ICD", ["SUBJECT_ID", "HADM_ID", "SEQ_NUM", "ICD9_CODE"])
    dx = merge_in_pandas1_order(dx[dx.ICD9_CODE.notna()], codes, ["ICD9_CODE"])
    for c in ("SUBJECT_ID", "HADM_ID", "SEQ_NUM"):
        dx[c] = dx[c].astype(int)
    dx = merge_in_pandas1_order(dx, stays[["SUBJECT_ID", "HADM_ID", "ICUSTAY_ID"]]
                                .drop_duplicates(), ["SUBJECT_ID", "HADM_ID"])
    dx = dx[DIAGNOSIS_COLUMNS]
    group = {code: (name, int(bool(d["use_in_benchmark"])))
             for name, d in definitions.items() for code in d["codes"]}
    dx["HCUP_CCS_2015"] = [group[c][0] if c in group else None for c in dx.ICD9_CODE]
    dx["USE_IN_BENCHMARK"] = pd.array([group[c][1] if c in group else None for c in dx.ICD9_CODE],
                                      dtype="Int64")
    return dx


def merge_in_pandas1_order(left: pd.DataFrame, right: pd.DataFrame, on: list[str]
                           ) -> pd.DataFrame:
    """An inner merge with the rows in the order pandas 1.x gives them, which the reference's
    `all_diagnoses.csv` and `diagnosis_counts.csv` have (pandas >= 2.2 keeps left's order):
    grouped by key in order of the key's first appearance in `left`; within a key, left's rows
    in order, each with right's matching rows in order."""
    lpos, rpos, group = "_left_row", "_right_row", "_key_rank"
    first = left.groupby(on, sort=False, dropna=False).ngroup().to_numpy()
    merged = left.assign(**{lpos: np.arange(len(left))}).merge(
        right.assign(**{rpos: np.arange(len(right))}), on=on)
    merged[group] = first[merged[lpos].to_numpy()]
    merged = merged.sort_values([group, lpos, rpos], kind="stable")
    return merged.drop(columns=[lpos, rpos, group]).reset_index(drop=True)


def diagnosis_counts(dx: pd.DataFrame) -> pd.DataFrame:
    """`diagnosis_counts.csv`: each code with its titles and the number of stays coded with it,
    in order of the code's first row in `dx` (as the reference)."""
    codes = dx[["ICD9_CODE", "SHORT_TITLE", "LONG_TITLE"]].drop_duplicates("ICD9_CODE")
    count = dx.groupby("ICD9_CODE").ICUSTAY_ID.count()
    codes = codes.assign(COUNT=codes.ICD9_CODE.map(count).fillna(0).astype(int))
    return codes[codes.COUNT > 0]


def phenotype_labels(dx: pd.DataFrame, stays: pd.DataFrame) -> pd.DataFrame:
    """`phenotype_labels.csv`: stays (by id) x benchmark groups present in the cohort, 0/1."""
    used = dx.loc[dx.USE_IN_BENCHMARK.fillna(0) > 0, ["ICUSTAY_ID", "HCUP_CCS_2015"]]
    used = used.drop_duplicates().assign(VALUE=1)
    table = used.pivot(index="ICUSTAY_ID", columns="HCUP_CCS_2015", values="VALUE")
    table = table.reindex(sorted(stays.ICUSTAY_ID))
    return table.fillna(0).astype(int).sort_index(axis=1)


def write_root_tables(cohort: Cohort, root: Path) -> None:
    """The four root-level files of the reference's `extract_subjects`."""
    root.mkdir(parents=True, exist_ok=True)
    cohort.stays.to_csv(root / "all_stays.csv", index=False)
    cohort.diagnoses[DIAGNOSIS_COLUMNS].to_csv(root / "all_diagnoses.csv", index=False)
    diagnosis_counts(cohort.diagnoses).to_csv(root / "diagnosis_counts.csv", index=False)
    phenotype_labels(cohort.diagnoses, cohort.stays).to_csv(
        root / "phenotype_labels.csv", index=False, quoting=csv.QUOTE_NONNUMERIC)


def _rows_by_subject(df: pd.DataFrame) -> dict[int, str]:
    """CSV text of `df`'s rows per subject (in `df`'s order), as pandas writes them."""
    buf: dict[int, io.StringIO] = {}
    values = df.astype(object).where(df.notna(), None)
    for row in values.itertuples(index=False, name=None):
        f = buf.get(row[0])
        if f is None:
            f = buf[row[0]] = io.StringIO()
        csv.writer(f, lineterminator="\n").writerow(row)
    return {int(k): v.getvalue() for k, v in buf.items()}


def write_subject_tables(cohort: Cohort, subject_dirs: dict[int, Path],
                         files: FileWriter) -> None:
    """`stays.csv` (by admission time) and `diagnoses.csv` (by stay, sequence) per subject;
    a subject with no coded diagnosis gets the header alone, as in the reference."""
    stays = cohort.stays  # sorted by subject, then as written
    dx = cohort.diagnoses.sort_values(["SUBJECT_ID", "ICUSTAY_ID", "SEQ_NUM"], kind="stable")
    stay_rows, dx_rows = _rows_by_subject(stays), _rows_by_subject(dx)
    stay_head, dx_head = ",".join(stays.columns) + "\n", ",".join(dx.columns) + "\n"
    files.mkdirs(list(subject_dirs.values()))
    for sid, d in subject_dirs.items():
        files.write(d / "stays.csv", (stay_head + stay_rows.get(sid, "")).encode())
        files.write(d / "diagnoses.csv", (dx_head + dx_rows.get(sid, "")).encode())
