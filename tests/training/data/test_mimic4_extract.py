"""`extract-mimic4` on a MIMIC-IV-shaped fixture written from the MIMIC-III demo's MetaVision part.

What this proves: the MIMIC-IV table and column layout (hosp/, icu/, lower-case headers,
stay_id, anchor_age/anchor_year, race, icd_version) is read and flows through the same rules:
every mortality stay and its time series equal the MIMIC-III path's for the same patients, and
admissions coded in ICD-10 are left out of phenotyping. What it does not prove: anything about
real MIMIC-IV content (its value formats and units, its lab itemids, its ICD-10 coding), since
the rows are MIMIC-III's. Needs ../shared/data (skipped without it).
"""

from __future__ import annotations

import gzip
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest

from scehr.training.data.mimic3.pipeline import extract
from tests.conftest import SHARED_DATA, needs_shared_data

pytestmark = needs_shared_data
DEMO = SHARED_DATA / "mimic3-demo"


def _demo(name: str) -> pd.DataFrame:
    return pd.read_csv(DEMO / f"{name}.csv.gz", dtype=str, keep_default_na=False)


def _write(df: pd.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", newline="") as f:
        df.to_csv(f, index=False, lineterminator="\n")


def write_mimic4_fixture(dest: Path) -> tuple[set[str], str]:
    """The demo's subjects whose every ICU stay is MetaVision, as MIMIC-IV tables; returns the
    subjects and the admission whose diagnoses are relabelled ICD-10."""
    icu = _demo("ICUSTAYS")
    cv = set(icu.subject_id[icu.dbsource != "metavision"])
    subjects = set(icu.subject_id) - cv
    icu = icu[icu.subject_id.isin(subjects)]
    pats = _demo("PATIENTS")
    pats = pats[pats.subject_id.isin(subjects)]
    first = icu.groupby("subject_id").intime.min()
    year = {s: int(first[s][:4]) for s in subjects}
    age = {s: min(91, (datetime.fromisoformat(first[s]) - datetime.fromisoformat(d)).days // 365)
           for s, d in zip(pats.subject_id, pats.dob, strict=True)}
    _write(pd.DataFrame({"subject_id": pats.subject_id, "gender": pats.gender,
                         "anchor_age": pats.subject_id.map(age),
                         "anchor_year": pats.subject_id.map(year),
                         "anchor_year_group": "2008 - 2010", "dod": pats.dod}),
           dest / "hosp" / "patients.csv.gz")
    adm = _demo("ADMISSIONS")
    adm = adm[adm.subject_id.isin(subjects)]
    _write(adm[["subject_id", "hadm_id", "admittime", "dischtime", "deathtime"]].assign(
        race=adm.ethnicity, hospital_expire_flag=adm.hospital_expire_flag),
        dest / "hosp" / "admissions.csv.gz")
    _write(icu[["subject_id", "hadm_id", "icustay_id", "first_careunit", "last_careunit",
                "intime", "outtime", "los"]].rename(columns={"icustay_id": "stay_id"}),
           dest / "icu" / "icustays.csv.gz")
    ch = _demo("CHARTEVENTS")
    ch = ch[ch.subject_id.isin(subjects)]
    _write(ch[["subject_id", "hadm_id", "icustay_id", "cgid", "charttime", "storetime", "itemid",
               "value", "valuenum", "valueuom", "warning"]].rename(
        columns={"icustay_id": "stay_id", "cgid": "caregiver_id"}),
        dest / "icu" / "chartevents.csv.gz")
    lab = _demo("LABEVENTS")
    lab = lab[lab.subject_id.isin(subjects)]
    _write(lab[["row_id", "subject_id", "hadm_id", "itemid", "charttime", "value", "valuenum",
                "valueuom", "flag"]].rename(columns={"row_id": "labevent_id"}),
           dest / "hosp" / "labevents.csv.gz")
    out = _demo("OUTPUTEVENTS")
    out = out[out.subject_id.isin(subjects)]
    _write(out[["subject_id", "hadm_id", "icustay_id", "charttime", "itemid", "value",
                "valueuom"]].rename(columns={"icustay_id": "stay_id"}),
           dest / "icu" / "outputevents.csv.gz")
    dx = _demo("DIAGNOSES_ICD")
    dx = dx[dx.subject_id.isin(subjects)]
    icd10_adm = sorted(set(dx.hadm_id))[0]
    dx = dx.assign(icd_version=["10" if h == icd10_adm else "9" for h in dx.hadm_id])
    _write(dx[["subject_id", "hadm_id", "seq_num", "icd9_code", "icd_version"]].rename(
        columns={"icd9_code": "icd_code"}), dest / "hosp" / "diagnoses_icd.csv.gz")
    names = _demo("D_ICD_DIAGNOSES")
    ten = names[names.icd9_code.isin(set(dx.icd9_code[dx.icd_version == "10"]))]
    _write(pd.DataFrame({"icd_code": [*names.icd9_code, *ten.icd9_code],
                         "icd_version": ["9"] * len(names) + ["10"] * len(ten),
                         "long_title": [*names.long_title, *ten.long_title]}),
           dest / "hosp" / "d_icd_diagnoses.csv.gz")
    return subjects, icd10_adm


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, set[str], str]:
    root = tmp_path_factory.mktemp("mimic4")
    subjects, icd10_adm = write_mimic4_fixture(root / "mimic4")
    iv, iii = root / "out4", root / "out3"
    extract(root / "mimic4", iv, schema="mimic4", progress=lambda _s: None)
    extract(DEMO, iii, progress=lambda _s: None)
    return iv, iii, subjects, icd10_adm


def _listing(out: Path, task: str, split: str) -> pd.DataFrame:
    return pd.read_csv(out / task / split / "listfile.csv")


@pytest.mark.parametrize("split", ["train", "test"])
def test_mortality_stays_and_series_equal_the_mimic3_path(runs: tuple, split: str) -> None:
    iv, iii, subjects, _ = runs
    a = _listing(iv, "in-hospital-mortality", split).set_index("stay").y_true
    b = _listing(iii, "in-hospital-mortality", split).set_index("stay").y_true
    b = b[[s.split("_")[0] in subjects for s in b.index]]
    assert len(b) > 0 and set(b.index) <= set(a.index)
    assert (a[b.index] == b).all()
    task = "in-hospital-mortality"
    for stay in b.index:
        assert (iv / task / split / stay).read_bytes() == (iii / task / split / stay).read_bytes()


def test_icd10_admissions_are_left_out_of_phenotyping(runs: tuple) -> None:
    iv, iii, _, icd10_adm = runs
    stays = pd.read_csv(iv / "root" / "all_stays.csv", dtype=str)
    icd10_subject = stays.SUBJECT_ID[stays.HADM_ID.eq(icd10_adm)].tolist()
    assert len(icd10_subject) == 1  # kept in the cohort ...
    ph = pd.concat([_listing(iv, "phenotyping", s) for s in ("train", "test")])
    assert not any(s.startswith(f"{icd10_subject[0]}_") for s in ph.stay)  # ... not phenotyped
    ph3 = pd.concat([_listing(iii, "phenotyping", s) for s in ("train", "test")])
    assert any(s.startswith(f"{icd10_subject[0]}_") for s in ph3.stay)
    # the other stays carry the MIMIC-III path's labels
    both = ph3[ph3.stay.isin(ph.stay)].set_index("stay").sort_index()
    assert len(both) >= len(ph) - 1 > 0
    mine = ph.set_index("stay").loc[both.index]
    pd.testing.assert_frame_equal(mine, both)
    prov = (iv / "provenance.json").read_text()
    assert '"schema": "mimic4"' in prov and '"admissions_left_out_of_phenotyping_icd10": 1' in prov
