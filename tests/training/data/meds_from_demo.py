"""A MEDS dataset written from the raw MIMIC-III demo tables the way public MIMIC MEDS ETLs write
it, so the MEDS input is tested on what such an ETL hands over, not on already cleaned files.

One event per CHARTEVENTS, LABEVENTS and OUTPUTEVENTS row, coded `LAB//<itemid>//<unit>` (chart
and lab rows, as the MIMIC-IV ETL codes both) or `OUTPUT//<itemid>//<unit>`, `UNK` where the row
has no unit; `numeric_value` is VALUENUM (float32, as MEDS stores it), `text_value` the source
text. MEDS_BIRTH, MEDS_DEATH (at the date of death, and at the time of an in-hospital death), a
static `GENDER//<g>`, hospital and ICU admission and discharge events and ICD-9 diagnoses at
discharge. `metadata/codes.parquet` describes every code, with the lab items' LOINC codes as
`LOINC/<code>` in `parent_codes`; `metadata/dataset.json` and `metadata/subject_splits.parquet`
(any split names) complete it; data shards sit under `data/<split>/`. The rows of one subject
and time are in table order, or shuffled (`seed`): MEDS leaves that order undefined.

The labels are the mortality stays of an `extract-mimic3` run (`mortality_labels`): the cohort
is not what the MEDS input is tested on. `phenotype_labels` gives its phenotyping stays, to
compare the ACES phenotype tasks with. As a command (docs/meds.md):
`python -m tests.training.data.meds_from_demo MIMIC_DIR MEDS_DIR --labels-from EXTRACTION`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path

import meds
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

ETL_NAME = "scehr tests: MIMIC-III demo to MEDS"


def _table(mimic_dir: Path, name: str) -> pd.DataFrame:
    df = pd.read_csv(mimic_dir / f"{name}.csv.gz", dtype=str, keep_default_na=False,
                     na_values=[""])
    df.columns = [c.lower() for c in df.columns]
    return df


def _unit(uom: pd.Series) -> pd.Series:
    return uom.fillna("UNK").where(uom.fillna("").str.len() > 0, "UNK")


@cache
def _events(mimic_dir: Path) -> pd.DataFrame:
    """Every event of the demo, in table order, before sorting (read once per session; never
    modified)."""
    parts = []
    pat = _table(mimic_dir, "PATIENTS")
    parts.append(pd.DataFrame({"subject_id": pat.subject_id, "time": pd.NaT,
                               "code": "GENDER//" + pat.gender}))
    parts.append(pd.DataFrame({"subject_id": pat.subject_id, "time": pd.to_datetime(pat.dob),
                               "code": meds.birth_code}))
    dead = pat[pat.dod.notna()]
    parts.append(pd.DataFrame({"subject_id": dead.subject_id, "time": pd.to_datetime(dead.dod),
                               "code": meds.death_code}))
    adm = _table(mimic_dir, "ADMISSIONS")
    parts.append(pd.DataFrame({
        "subject_id": adm.subject_id, "time": pd.to_datetime(adm.admittime),
        "code": "HOSPITAL_ADMISSION//" + adm.admission_type + "//"
                + adm.admission_location.fillna("UNK"), "hadm_id": adm.hadm_id}))
    parts.append(pd.DataFrame({
        "subject_id": adm.subject_id, "time": pd.to_datetime(adm.dischtime),
        "code": "HOSPITAL_DISCHARGE//" + adm.discharge_location.fillna("UNK"),
        "hadm_id": adm.hadm_id}))
    died = adm[adm.deathtime.notna()]  # in hospital: at its time, as MIMIC-IV's ETL writes it
    parts.append(pd.DataFrame({"subject_id": died.subject_id,
                               "time": pd.to_datetime(died.deathtime), "code": meds.death_code,
                               "hadm_id": died.hadm_id}))
    icu = _table(mimic_dir, "ICUSTAYS")
    for col, what, unit in (("intime", "ICU_ADMISSION", "first_careunit"),
                            ("outtime", "ICU_DISCHARGE", "last_careunit")):
        parts.append(pd.DataFrame({
            "subject_id": icu.subject_id, "time": pd.to_datetime(icu[col]),
            "code": f"{what}//" + icu[unit], "hadm_id": icu.hadm_id,
            "icustay_id": icu.icustay_id}))
    dx = _table(mimic_dir, "DIAGNOSES_ICD").merge(adm[["hadm_id", "dischtime"]], on="hadm_id")
    parts.append(pd.DataFrame({"subject_id": dx.subject_id, "time": pd.to_datetime(dx.dischtime),
                               "code": "DIAGNOSIS//ICD//9//" + dx.icd9_code,
                               "hadm_id": dx.hadm_id}))
    for name, prefix, number in (("CHARTEVENTS", "LAB", "valuenum"),
                                 ("LABEVENTS", "LAB", "valuenum"),
                                 ("OUTPUTEVENTS", "OUTPUT", "value")):
        ev = _table(mimic_dir, name)
        parts.append(pd.DataFrame({
            "subject_id": ev.subject_id, "time": pd.to_datetime(ev.charttime),
            "code": prefix + "//" + ev.itemid + "//" + _unit(ev.valueuom),
            "numeric_value": pd.to_numeric(ev[number]).astype("float32"),
            "text_value": None if name == "OUTPUTEVENTS" else ev.value,
            "hadm_id": ev.hadm_id, "icustay_id": ev.get("icustay_id")}))
    out = pd.concat(parts, ignore_index=True)
    out["subject_id"] = out.subject_id.astype("int64")
    for col in ("hadm_id", "icustay_id"):
        out[col] = pd.to_numeric(out[col]).astype("Int64")
    return out


def _codes(mimic_dir: Path, codes: pd.Series) -> pd.DataFrame:
    """`metadata/codes.parquet`: each code's description, LOINC parents for lab items."""
    items = _table(mimic_dir, "D_ITEMS")[["itemid", "label"]]
    labs = _table(mimic_dir, "D_LABITEMS")
    label = {**dict(zip(items.itemid, items.label, strict=True)),
             **dict(zip(labs.itemid, labs.label + " (" + labs.fluid + ")", strict=True))}
    loinc = dict(zip(labs.itemid, labs.loinc_code, strict=True))
    rows = []
    for code in sorted(set(codes)):
        parts = code.split("//")
        if parts[0] in ("LAB", "OUTPUT"):
            parent = loinc.get(parts[1])
            rows.append((code, label.get(parts[1]),
                         [f"LOINC/{parent}"] if isinstance(parent, str) else None))
        else:
            rows.append((code, None, None))
    return pd.DataFrame(rows, columns=["code", "description", "parent_codes"])


def write_meds_from_demo(mimic_dir: Path, dest: Path, splits: Mapping[int, str], *,
                         seed: int | None = None, row_group_size: int | None = None) -> Path:
    """Write the MEDS dataset to `dest`; `splits` gives each subject's split name (subjects it
    does not name go to `train`); `seed` shuffles the events of each subject and time;
    `row_group_size`: rows per Parquet row group of the shards (None: pyarrow's default)."""
    ev = _events(mimic_dir)
    if seed is not None:
        ev = ev.iloc[np.random.default_rng(seed).permutation(len(ev))]
    ev = ev.sort_values(["subject_id", "time"], kind="stable", na_position="first")
    split = ev.subject_id.map(lambda s: splits.get(int(s), meds.train_split))
    for name in sorted(set(split)):
        shard = dest / meds.data_subdirectory / name / "0.parquet"
        shard.parent.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pandas(ev[split == name], preserve_index=False)
        pq.write_table(meds.DataSchema.align(table), shard, row_group_size=row_group_size)
    (dest / "metadata").mkdir(parents=True, exist_ok=True)
    pq.write_table(meds.CodeMetadataSchema.align(pa.Table.from_pandas(
        _codes(mimic_dir, ev.code), preserve_index=False)), dest / meds.code_metadata_filepath)
    subjects = sorted(set(ev.subject_id.tolist()))
    sp = pd.DataFrame({"subject_id": subjects,
                       "split": [splits.get(s, meds.train_split) for s in subjects]})
    pq.write_table(meds.SubjectSplitSchema.align(pa.Table.from_pandas(sp, preserve_index=False)),
                   dest / meds.subject_splits_filepath)
    metadata = {"dataset_name": "MIMIC-III Clinical Database Demo", "dataset_version": "1.4",
                "etl_name": ETL_NAME, "etl_version": "1", "meds_version": meds.__version__,
                "created_at": "2026-01-01T00:00:00"}
    meds.DatasetMetadataSchema.validate(metadata)
    (dest / meds.dataset_metadata_filepath).write_text(json.dumps(metadata, indent=2))
    return dest


MEDS_SPLIT = {"train": "train", "val": "tuning", "test": "held_out"}


def _listed_stays(extraction: Path, task_dir: str) -> pd.DataFrame:
    """The listfile rows of a task folder of an `extract-mimic3` output, with each stay's
    subject, ICU stay id and split (train, val, test)."""
    parts = []
    for part in ("train", "val", "test"):
        listing = pd.read_csv(extraction / task_dir / f"{part}_listfile.csv")
        ids = []
        for stay in listing.stay:
            sid, episode = stay.split("_")[:2]
            ep = pd.read_csv(extraction / "root" / ("test" if part == "test" else "train") / sid
                             / f"{episode}.csv")
            ids.append((int(sid), int(ep.Icustay[0])))
        listing[["subject_id", "icustay_id"]] = pd.DataFrame(ids, index=listing.index)
        parts.append(listing.assign(split=part))
    return pd.concat(parts, ignore_index=True)


def _stay_times(extraction: Path) -> pd.DataFrame:
    return pd.read_csv(extraction / "root" / "all_stays.csv",
                       parse_dates=["INTIME", "OUTTIME"]).set_index("ICUSTAY_ID")


def mortality_labels(extraction: Path) -> pd.DataFrame:
    """The in-hospital-mortality stays of an `extract-mimic3` output as MEDS labels: subject_id,
    prediction_time (in-time + 48 h), boolean_value, and the stay file and split (train, val,
    test) they come from."""
    lab = _listed_stays(extraction, "in-hospital-mortality")
    lab["prediction_time"] = (_stay_times(extraction).INTIME[lab.icustay_id].to_numpy()
                              + pd.Timedelta(hours=48))
    lab["boolean_value"] = lab.y_true.astype(bool)
    return lab[["subject_id", "prediction_time", "boolean_value", "stay", "split"]]


def phenotype_labels(extraction: Path) -> pd.DataFrame:
    """The phenotyping stays of an `extract-mimic3` output: subject_id, prediction_time (the ICU
    discharge, where the ACES phenotype tasks predict) and the 25 labels, one column each."""
    lab = _listed_stays(extraction, "phenotyping")
    lab["prediction_time"] = _stay_times(extraction).OUTTIME[lab.icustay_id].to_numpy()
    labels = [c for c in lab.columns if c not in (
        "stay", "period_length", "subject_id", "icustay_id", "split", "prediction_time")]
    return lab[["subject_id", "prediction_time", *labels]]


def write_labels(lab: pd.DataFrame, path: Path) -> Path:
    """`lab`'s MEDS label columns as a label table."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(meds.LabelSchema.align(pa.Table.from_pandas(
        lab[["subject_id", "prediction_time", "boolean_value"]], preserve_index=False)), path)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mimic_dir", type=Path, help="the raw MIMIC-III demo tables")
    p.add_argument("dest", type=Path, help="MEDS dataset to write")
    p.add_argument("--labels-from", type=Path, required=True,
                   help="extract-mimic3 output: its mortality stays become DEST-labels.parquet "
                        "and their splits the MEDS splits (train, tuning, held_out); its "
                        "phenotyping stays DEST-phenotypes.parquet")
    p.add_argument("--seed", type=int, default=None, help="shuffle same-time events")
    args = p.parse_args()
    lab = mortality_labels(args.labels_from)
    write_meds_from_demo(args.mimic_dir, args.dest, {s: MEDS_SPLIT[p] for s, p in zip(
        lab.subject_id, lab.split, strict=True)}, seed=args.seed)
    labels = write_labels(lab, args.dest.with_name(args.dest.name + "-labels.parquet"))
    phenotypes = args.dest.with_name(args.dest.name + "-phenotypes.parquet")
    phenotype_labels(args.labels_from).to_parquet(phenotypes, index=False)
    print(f"wrote {args.dest}, {labels} ({len(lab)} stays) and {phenotypes}")


if __name__ == "__main__":
    main()
