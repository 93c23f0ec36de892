"""MIMIC-IV (v2+, `hosp/` and `icu/` modules) seen as MIMIC-III, for the same pipeline.

The small tables are rewritten in MIMIC-III's shape into the work folder; the event tables are
read where they are, `stay_id` standing for ICUSTAY_ID. What MIMIC-IV lacks or spells
differently, and what is done about it:

- date of birth: MIMIC-IV gives `anchor_age` in `anchor_year`; DOB is set to 1 January of
  `anchor_year - anchor_age`, so the age at ICU admission is `anchor_age` plus the years
  elapsed since `anchor_year` (to within a year, as MIMIC-IV allows);
- wards: ICU stays have no ward ids, so the transfer filter compares care units only;
- ethnicity is `race`; the admission diagnosis text does not exist (left empty);
- diagnoses are ICD-9 or ICD-10 (`icd_version`). The 25 benchmark phenotypes are defined on
  ICD-9 codes (HCUP CCS 2015). No ICD-10 -> ICD-9 mapping ships here (the CMS General
  Equivalence Mappings are one-to-many and their use for these groups is unvalidated), so
  ICD-10 codes are carried as `ICD10:<code>` (matching no CCS group and no ICD-9 code), and
  stays of admissions coded in ICD-10 are left out of the phenotyping task; they stay in the
  mortality task, which needs no diagnosis.
- itemids: MIMIC-IV's ICU items are MetaVision's, which `itemid_to_variable_map.csv` covers,
  as it covers the common lab items.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from scehr.training.data.mimic3.sources import PANDAS1_NA, header

#: MIMIC-III event table -> (MIMIC-IV file, its column standing for ICUSTAY_ID).
EVENT_FILES = {"CHARTEVENTS": ("icu/chartevents", "STAY_ID"),
               "LABEVENTS": ("hosp/labevents", None),
               "OUTPUTEVENTS": ("icu/outputevents", "STAY_ID")}


def table_file(mimic4_dir: Path, name: str) -> Path:
    """`hosp/patients` -> its .csv.gz or .csv under `mimic4_dir`."""
    for ext in (".csv.gz", ".csv"):
        p = Path(mimic4_dir) / f"{name}{ext}"
        if p.is_file():
            return p
    raise FileNotFoundError(f"MIMIC-IV table {name} not found under {mimic4_dir} "
                            f"(tried {name}.csv.gz, {name}.csv)")


def _read(mimic4_dir: Path, name: str) -> pd.DataFrame:
    path = table_file(mimic4_dir, name)
    df = pd.read_csv(path, dtype=object, keep_default_na=False, na_values=list(PANDAS1_NA),
                     header=0, names=header(path))
    return df.astype(object).where(df.notna(), None)


def write_mimic3_view(mimic4_dir: Path, dest: Path) -> set[int]:
    """MIMIC-III-shaped PATIENTS, ADMISSIONS, ICUSTAYS, DIAGNOSES_ICD, D_ICD_DIAGNOSES in
    `dest`; returns the admissions coded in ICD-10 (left out of phenotyping)."""
    dest.mkdir(parents=True, exist_ok=True)
    pats = _read(mimic4_dir, "hosp/patients")
    dob = [f"{int(y) - int(a):04d}-01-01 00:00:00"
           for y, a in zip(pats.ANCHOR_YEAR, pats.ANCHOR_AGE, strict=True)]
    pd.DataFrame({"ROW_ID": range(len(pats)), "SUBJECT_ID": pats.SUBJECT_ID,
                  "GENDER": pats.GENDER, "DOB": dob, "DOD": pats.DOD}).to_csv(
        dest / "PATIENTS.csv", index=False)
    adm = _read(mimic4_dir, "hosp/admissions")
    race = adm.RACE if "RACE" in adm else adm.get("ETHNICITY")
    pd.DataFrame({"ROW_ID": range(len(adm)), "SUBJECT_ID": adm.SUBJECT_ID,
                  "HADM_ID": adm.HADM_ID, "ADMITTIME": adm.ADMITTIME,
                  "DISCHTIME": adm.DISCHTIME, "DEATHTIME": adm.DEATHTIME, "ETHNICITY": race,
                  "DIAGNOSIS": None}).to_csv(dest / "ADMISSIONS.csv", index=False)
    icu = _read(mimic4_dir, "icu/icustays")
    pd.DataFrame({"ROW_ID": range(len(icu)), "SUBJECT_ID": icu.SUBJECT_ID,
                  "HADM_ID": icu.HADM_ID, "ICUSTAY_ID": icu.STAY_ID, "DBSOURCE": "metavision",
                  "FIRST_CAREUNIT": icu.FIRST_CAREUNIT, "LAST_CAREUNIT": icu.LAST_CAREUNIT,
                  "FIRST_WARDID": 0, "LAST_WARDID": 0, "INTIME": icu.INTIME,
                  "OUTTIME": icu.OUTTIME, "LOS": icu.LOS}).to_csv(dest / "ICUSTAYS.csv",
                                                                 index=False)
    dx = _read(mimic4_dir, "hosp/diagnoses_icd")
    icd10 = {int(h) for h, v in zip(dx.HADM_ID, dx.ICD_VERSION, strict=True) if str(v) == "10"}
    pd.DataFrame({"ROW_ID": range(len(dx)), "SUBJECT_ID": dx.SUBJECT_ID, "HADM_ID": dx.HADM_ID,
                  "SEQ_NUM": dx.SEQ_NUM, "ICD9_CODE": _codes(dx)}).to_csv(
        dest / "DIAGNOSES_ICD.csv", index=False)
    names = _read(mimic4_dir, "hosp/d_icd_diagnoses")
    pd.DataFrame({"ROW_ID": range(len(names)), "ICD9_CODE": _codes(names),
                  "SHORT_TITLE": names.LONG_TITLE, "LONG_TITLE": names.LONG_TITLE}).to_csv(
        dest / "D_ICD_DIAGNOSES.csv", index=False)
    return icd10


def _codes(df: pd.DataFrame) -> list[str]:
    """ICD-9 codes as they are; ICD-10 codes prefixed `ICD10:` so that none is taken for an
    ICD-9 code of the same spelling (E-codes, V-codes) or matches a CCS group."""
    return [c if str(v) == "9" else f"ICD10:{c}"
            for c, v in zip(df.ICD_CODE, df.ICD_VERSION, strict=True)]
