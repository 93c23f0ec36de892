"""`scehr data extract-mimic3`: the benchmark's rules on a small raw fixture, and equality with
mimic3-benchmarks' own output on the MIMIC-III demo (fingerprints in tests/oracles): root and
the four tasks (in-hospital mortality, decompensation, length of stay, phenotyping).

Both need ../shared/data (the benchmark's resource files; the demo) and skip without it.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from scehr.training.data.mimic3.compare import ORDER_FREE, compare_trees
from scehr.training.data.mimic3.pipeline import extract
from scehr.training.data.mimic3.sources import Resources
from tests.conftest import SHARED_DATA, needs_shared_data
from tests.oracles.mimic3_reference import MANIFEST, check

pytestmark = needs_shared_data

DEMO = SHARED_DATA / "mimic3-demo"
QUIET = lambda _s: None  # noqa: E731


# ------------------------------------------------------------------ a small raw fixture

def _tables() -> dict[str, tuple[list[str], list[list[str]]]]:
    """Raw tables covering each cohort filter, validation rule and cleaning rule."""
    pat = (["ROW_ID", "SUBJECT_ID", "GENDER", "DOB", "DOD"], [
        ["1", "1", "F", "2100-01-01 00:00:00", "2150-01-20 00:00:00"],   # kept, dies in hospital
        ["2", "2", "M", "2140-01-01 00:00:00", ""],                      # 10 years old
        ["3", "3", "M", "2050-01-01 00:00:00", ""],                      # 2 ICU stays, 1 admission
        ["4", "4", "F", "2050-01-01 00:00:00", ""],                      # ward transfer
    ])
    adm = (["ROW_ID", "SUBJECT_ID", "HADM_ID", "ADMITTIME", "DISCHTIME", "DEATHTIME", "ETHNICITY",
            "DIAGNOSIS"], [
        ["1", "1", "100", "2150-01-01 00:00:00", "2150-01-20 12:00:00", "", "WHITE", "SEPSIS"],
        ["2", "2", "200", "2150-01-01 00:00:00", "2150-01-05 00:00:00", "", "ASIAN", "X"],
        ["3", "3", "300", "2150-01-01 00:00:00", "2150-01-09 00:00:00", "", "ASIAN", "X"],
        ["4", "4", "400", "2150-01-01 00:00:00", "2150-01-09 00:00:00", "", "ASIAN", "X"],
    ])
    icu = (["ROW_ID", "SUBJECT_ID", "HADM_ID", "ICUSTAY_ID", "DBSOURCE", "FIRST_CAREUNIT",
            "LAST_CAREUNIT", "FIRST_WARDID", "LAST_WARDID", "INTIME", "OUTTIME", "LOS"], [
        ["1", "1", "100", "1000", "carevue", "MICU", "MICU", "7", "7", "2150-01-02 00:00:00",
         "2150-01-05 00:00:00", "3.0"],
        ["2", "2", "200", "2000", "carevue", "MICU", "MICU", "7", "7", "2150-01-02 00:00:00",
         "2150-01-04 00:00:00", "2.0"],
        ["3", "3", "300", "3000", "carevue", "MICU", "MICU", "7", "7", "2150-01-02 00:00:00",
         "2150-01-03 00:00:00", "1.0"],
        ["4", "3", "300", "3001", "carevue", "MICU", "MICU", "7", "7", "2150-01-04 00:00:00",
         "2150-01-06 00:00:00", "2.0"],
        ["5", "4", "400", "4000", "carevue", "MICU", "MICU", "7", "8", "2150-01-02 00:00:00",
         "2150-01-06 00:00:00", "4.0"],
    ])
    dx = (["ROW_ID", "SUBJECT_ID", "HADM_ID", "SEQ_NUM", "ICD9_CODE"], [
        ["1", "1", "100", "1", "0389"], ["2", "1", "100", "2", "4019"],
        ["3", "1", "100", "3", "V5861"]])
    dcodes = (["ROW_ID", "ICD9_CODE", "SHORT_TITLE", "LONG_TITLE"], [
        ["1", "0389", "Septicemia NOS", "Unspecified septicemia"],
        ["2", "4019", "Hypertension NOS", "Unspecified essential hypertension"],
        ["3", "V5861", "Long-term use anticoagul", "Long-term (current) use of anticoagulants"]])
    t = "2150-01-02 0{}:00:00"
    chart_head = ["ROW_ID", "SUBJECT_ID", "HADM_ID", "ICUSTAY_ID", "ITEMID", "CHARTTIME",
                  "STORETIME", "CGID", "VALUE", "VALUENUM", "VALUEUOM"]
    rows = [
        ("1", "100", "1000", "211", t.format(1), "99", "bpm"),       # heart rate, kept as text
        ("1", "100", "1000", "211", t.format(1), "100", "bpm"),      # same time: "99" > "100"
        ("1", "100", "1000", "51", t.format(1), "120/80", ""),      # SBP from "sys/dia"
        ("1", "100", "1000", "8368", t.format(1), "120/80", ""),    # DBP from "sys/dia"
        ("1", "100", "", "676", t.format(2), "98.6", "?F"),          # no ICU stay: recovered;
        ("1", "100", "1000", "834", t.format(2), "0.95", "%"),       # >= 79: F -> C; SaO2 x100
        ("1", "100", "1000", "184", t.format(3), "None", ""),        # GCS eye "None" is a value
        ("1", "100", "1000", "763", t.format(3), "150", "lb"),       # pounds -> kg
        ("1", "100", "1000", "1394", t.format(3), "70", "in"),       # inches -> cm, rounded
        ("1", "", "1000", "211", t.format(4), "80", "bpm"),          # no admission: dropped
        ("1", "100", "9999", "211", t.format(5), "81", "bpm"),       # another ICU stay: dropped
        ("1", "100", "1000", "3348", t.format(5), "Brisk", ""),      # capillary refill -> 0
        ("2", "200", "2000", "211", t.format(1), "90", "bpm"),       # child: not extracted
    ]
    chart = (chart_head, [[str(i), *r[:3], r[3], r[4], r[4], "1", r[5], "", r[6]]
                          for i, r in enumerate(rows)])
    lab = (["ROW_ID", "SUBJECT_ID", "HADM_ID", "ITEMID", "CHARTTIME", "VALUE", "VALUENUM",
            "VALUEUOM", "FLAG"], [
        ["1", "1", "100", "50820", t.format(2), "7.4", "7.4", "units", ""],
        ["2", "1", "100", "50931", t.format(2), "ERROR", "", "mg/dL", ""],  # glucose: dropped
    ])
    out = (["ROW_ID", "SUBJECT_ID", "HADM_ID", "ICUSTAY_ID", "CHARTTIME", "ITEMID", "VALUE",
            "VALUEUOM"], [])
    return {"PATIENTS": pat, "ADMISSIONS": adm, "ICUSTAYS": icu, "DIAGNOSES_ICD": dx,
            "D_ICD_DIAGNOSES": dcodes, "CHARTEVENTS": chart, "LABEVENTS": lab,
            "OUTPUTEVENTS": out}


def write_raw(folder: Path, *, lower_gz: bool,
              tables: dict[str, tuple[list[str], list[list[str]]]] | None = None) -> Path:
    """The fixture (or `tables`, changed from it) as the official files (upper case, .csv) or
    the demo's (lower case, .gz)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, (head, rows) in (tables or _tables()).items():
        if lower_gz:
            with gzip.open(folder / f"{name}.csv.gz", "wt", newline="") as f:
                csv.writer(f, lineterminator="\n").writerows([[h.lower() for h in head], *rows])
        else:
            with open(folder / f"{name}.csv", "w", newline="") as f:
                csv.writer(f, lineterminator="\n").writerows([head, *rows])
    return folder


@pytest.fixture(scope="module")
def fixture_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("mimic3")
    out = tmp / "out"
    extract(write_raw(tmp / "raw", lower_gz=False), out, memory_limit="512MB", threads=1,
            progress=QUIET)
    return out


def _episode(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / "root" / "train" / "1" / "episode1_timeseries.csv", dtype=str,
                       keep_default_na=False)


def test_cohort_filters_children_multi_stay_admissions_and_transfers(fixture_out: Path) -> None:
    prov = json.loads((fixture_out / "provenance.json").read_text())
    assert [prov["cohort"][k]["icu_stays"] for k in
            ("start", "no_transfers", "one_stay_per_admission", "adults")] == [5, 4, 2, 1]
    stays = pd.read_csv(fixture_out / "root" / "all_stays.csv")
    assert stays.ICUSTAY_ID.tolist() == [1000]
    assert stays.MORTALITY.tolist() == [1] and stays.MORTALITY_INUNIT.tolist() == [0]
    assert sorted(p.name for p in (fixture_out / "root" / "train").iterdir()) == ["1"]


def test_validation_drops_and_recovers_like_the_reference(fixture_out: Path) -> None:
    v = json.loads((fixture_out / "provenance.json").read_text())["validation"]
    assert v == {"n_events": 14, "empty_hadm": 1, "no_hadm_in_stay": 0, "no_icustay": 3,
                 "recovered": 3, "could_not_recover": 0, "icustay_missing_in_stays": 1}
    events = pd.read_csv(fixture_out / "root" / "train" / "1" / "events.csv", dtype=str)
    assert len(events) == 12 and set(events.ICUSTAY_ID) == {"1000"}


def test_value_cleaning(fixture_out: Path) -> None:
    ep = _episode(fixture_out)
    at = {h: row for h, row in zip(ep.Hours, ep.to_dict("records"), strict=True)}
    assert at["1.0"]["Heart Rate"] == "99"  # the reference keeps the last in string order
    assert at["1.0"]["Systolic blood pressure"] == "120.0"
    assert at["1.0"]["Diastolic blood pressure"] == "80.0"
    assert at["2.0"]["Temperature"] == repr((98.6 - 32) * 5.0 / 9)
    assert at["2.0"]["Oxygen saturation"] == repr(0.95 * 100.0)
    assert at["2.0"]["pH"] == "7.4" and at["2.0"]["Glucose"] == ""  # "ERROR" dropped
    assert at["3.0"]["Glascow coma scale eye opening"] == "None"
    assert at["3.0"]["Weight"] == repr(150 * 0.453592)
    assert at["3.0"]["Height"] == "178.0"
    assert at["5.0"]["Capillary refill rate"] == "0.0"
    assert "4.0" not in at  # the event without an admission


def test_episode_labels_and_tasks(fixture_out: Path) -> None:
    label = pd.read_csv(fixture_out / "root" / "train" / "1" / "episode1.csv")
    assert label.loc[0, "Mortality"] == 1 and label.loc[0, "Length of Stay"] == 3.0
    assert label.loc[0, "Weight"] == pytest.approx(150 * 0.453592)
    assert label.loc[0, "Diagnosis 0389"] == 1 and label.loc[0, "Diagnosis 4019"] == 1
    ihm = pd.read_csv(fixture_out / "in-hospital-mortality" / "train" / "listfile.csv")
    assert ihm.to_dict("records") == [{"stay": "1_episode1_timeseries.csv", "y_true": 1}]
    ph = pd.read_csv(fixture_out / "phenotyping" / "train" / "listfile.csv")
    assert ph.loc[0, "period_length"] == 72.0
    assert ph.loc[0, "Septicemia (except in labor)"] == 1
    assert ph.loc[0, "Essential hypertension"] == 1
    assert ph.iloc[0, 2:].sum() == 2


def _listfile(out: Path, task: str, split: str = "train") -> list[tuple[float, str]]:
    """(period_length, y_true) rows of a listfile, by hour (train listfiles are shuffled)."""
    lf = pd.read_csv(out / task / split / "listfile.csv", dtype=str)
    assert set(lf.stay) == {"1_episode1_timeseries.csv"}
    return sorted((float(t), y) for t, y in zip(lf.period_length, lf.y_true, strict=True))


def test_hourly_tasks_without_a_death_time(fixture_out: Path) -> None:
    """A sample each hour t of the 72 h stay with t > 4 h and after the first row (1 h);
    decompensation is 0 throughout: the patient dies in hospital (date of death) but the
    admission has no death time, which the reference's label needs; length of stay counts
    down the hours left."""
    decomp, los = _listfile(fixture_out, "decompensation"), _listfile(fixture_out,
                                                                     "length-of-stay")
    assert decomp == [(float(t), "0") for t in range(5, 73)]
    assert los == [(float(t), f"{72.0 - t:.6f}") for t in range(5, 73)]
    ts = (fixture_out / "phenotyping" / "train" / "1_episode1_timeseries.csv").read_bytes()
    for task in ("decompensation", "length-of-stay"):
        assert (fixture_out / task / "train" / "1_episode1_timeseries.csv").read_bytes() == ts
        head, *rows = (fixture_out / task / "train" / "listfile.csv").read_text().splitlines()
        split = [(fixture_out / task / f).read_text().splitlines() for f in
                 ("train_listfile.csv", "val_listfile.csv")]
        assert head == "stay,period_length,y_true" and split[0] == [head, *rows]
        assert split[1] == [head]  # subject 1 is not in valset.csv
    assert json.loads((fixture_out / "provenance.json").read_text())["tasks"][
        "decompensation"] == {"train": 1, "train_samples": 68, "test": 0, "test_samples": 0}


def test_hourly_tasks_with_a_death_in_the_stay(tmp_path: Path) -> None:
    """Death 60 h after ICU admission (stay of 72 h): decompensation samples stop at 60 h and
    are 1 in the last 24 h before death; length of stay still runs to the end of the stay."""
    tables = _tables()
    head, rows = tables["ADMISSIONS"]
    rows = [list(r) for r in rows]
    rows[0][head.index("DEATHTIME")] = "2150-01-04 12:00:00"
    tables["ADMISSIONS"] = (head, rows)
    out = tmp_path / "out"
    extract(write_raw(tmp_path / "raw", lower_gz=False, tables=tables), out,
            memory_limit="512MB", threads=1, progress=QUIET)
    assert _listfile(out, "decompensation") == [(float(t), "1" if t > 36 else "0")
                                                for t in range(5, 61)]
    assert _listfile(out, "length-of-stay") == [(float(t), f"{72.0 - t:.6f}")
                                                for t in range(5, 73)]


def test_values_typed_after_validation_as_the_episode_step_reads_them(tmp_path: Path) -> None:
    """A subject whose only text value is in a row validation drops: its events.csv keeps
    the source text ("86", typed before validation), its timeseries has the number as the
    reference's episode step re-reads the validated file ("86.0")."""
    tables = _tables()
    head, _ = tables["CHARTEVENTS"]
    t = "2150-01-02 0{}:00:00"
    rows = [("1", "100", "1000", "211", t.format(1), "86", "bpm"),   # kept
            ("1", "", "1000", "211", t.format(4), "abc", "bpm")]     # no admission: dropped
    tables["CHARTEVENTS"] = (head, [[str(i), *r[:3], r[3], r[4], r[4], "1", r[5], "", r[6]]
                                    for i, r in enumerate(rows)])
    tables["LABEVENTS"] = (tables["LABEVENTS"][0], [])
    raw = tmp_path / "raw"
    raw.mkdir()
    for name, (h, r) in tables.items():
        with open(raw / f"{name}.csv", "w", newline="") as f:
            csv.writer(f, lineterminator="\n").writerows([h, *r])
    out = tmp_path / "out"
    extract(raw, out, memory_limit="512MB", threads=1, progress=QUIET)
    events = pd.read_csv(out / "root" / "train" / "1" / "events.csv", dtype=str)
    assert events.VALUE.tolist() == ["86"]
    assert _episode(out)["Heart Rate"].tolist() == ["86.0"]


def test_header_case_and_gzip_give_the_same_output(fixture_out: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    extract(write_raw(tmp_path / "raw", lower_gz=True), out, memory_limit="512MB", threads=1,
            progress=QUIET)
    assert compare_trees(out, fixture_out).identical == len(
        [p for p in fixture_out.rglob("*") if p.is_file() and ".mimic3-work" not in p.parts
         and p.name != "provenance.json"])


def test_rerun_reuses_the_scan_and_rewrites_the_same_files(fixture_out: Path,
                                                            tmp_path: Path) -> None:
    raw = write_raw(tmp_path / "raw", lower_gz=False)
    out = tmp_path / "out"
    extract(raw, out, memory_limit="512MB", threads=1, progress=QUIET)
    (out / "root" / "train" / "1" / "stale.csv").write_text("x\n")
    said: list[str] = []
    extract(raw, out, memory_limit="512MB", threads=1, progress=said.append)
    assert any(s.startswith("scan CHARTEVENTS: reusing") for s in said)
    assert compare_trees(out, fixture_out).equal  # stale file gone, outputs as before


def test_missing_table_is_named(tmp_path: Path) -> None:
    raw = write_raw(tmp_path / "raw", lower_gz=False)
    (raw / "LABEVENTS.csv").unlink()
    with pytest.raises(FileNotFoundError, match="LABEVENTS"):
        extract(raw, tmp_path / "out", progress=QUIET)


def test_missing_resources_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"itemid_to_variable_map\.csv"):
        Resources.from_dir(tmp_path)


# ------------------------------------------------------------------ the demo vs the reference

@pytest.fixture(scope="module")
def demo_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mimic3-demo") / "out"
    extract(DEMO, out, progress=QUIET)
    return out


def test_demo_extraction_equals_mimic3_benchmarks(demo_out: Path) -> None:
    """Every file of the reference's output on the demo (915: root and the four tasks), byte
    for byte, but two documented exceptions (docs/mimic.md): row order where the reference's
    is arbitrary, and Age 1 ulp off in the reference's episode files."""
    res = check(demo_out, json.loads(MANIFEST.read_text()))
    print({k: len(v) for k, v in res.items()})
    assert res["different"] == [] and res["only_ours"] == [] and res["only_reference"] == []
    assert len(res["identical"]) == 898
    assert {p.rsplit("/", 1)[-1] for p in res["reordered"]} <= ORDER_FREE
    assert len(res["reordered"]) == 11
    assert len(res["age_ulp"]) == 6


def test_demo_hourly_tasks_equal_mimic3_benchmarks(demo_out: Path) -> None:
    """decompensation/ and length-of-stay/: every timeseries file and the sorted test listfile
    byte-identical to the reference's; its train listfile (and the train/val split of it)
    holds the same rows, shuffled from the file system's order of the subject folders."""
    res = check(demo_out, json.loads(MANIFEST.read_text()))
    for task in ("decompensation", "length-of-stay"):
        mine = {k: [p for p in v if p.startswith(f"{task}/")] for k, v in res.items()}
        print(task, {k: len(v) for k, v in mine.items()})
        assert mine["reordered"] == [f"{task}/{f}" for f in
                                     ("train/listfile.csv", "train_listfile.csv",
                                      "val_listfile.csv")]
        assert len(mine["identical"]) == 115  # 113 stays' files, the test listfile twice
        assert f"{task}/test/listfile.csv" in mine["identical"]
        assert not (mine["different"] or mine["only_ours"] or mine["only_reference"]
                    or mine["age_ulp"])


def test_demo_diagnosis_tables_in_the_reference_row_order(demo_out: Path) -> None:
    """all_diagnoses.csv and diagnosis_counts.csv byte-identical: rows in pandas 1.x's
    inner-merge order (grouped by key in order of first appearance), as the reference."""
    res = check(demo_out, json.loads(MANIFEST.read_text()))
    assert {"root/all_diagnoses.csv", "root/diagnosis_counts.csv"} <= set(res["identical"])


def test_reference_age_differs_from_its_own_all_stays(demo_out: Path) -> None:
    """The 6 episode files whose Age differs are the reference's bug, not ours: our all_stays.csv
    is byte-identical to the reference's, our episode Age is the value in it, and the
    reference's episode Age is the next float beside it (pandas 1.2's inexact parser)."""
    res = check(demo_out, json.loads(MANIFEST.read_text()))
    assert "root/all_stays.csv" in res["identical"]
    stays = pd.read_csv(demo_out / "root" / "all_stays.csv")
    age = dict(zip(stays.ICUSTAY_ID, stays.AGE, strict=True))
    for rel in res["age_ulp"]:
        ep = pd.read_csv(demo_out / rel)
        ours = float(ep.loc[0, "Age"])
        assert ours == age[int(ep.loc[0, "Icustay"])]
        step = json.loads(MANIFEST.read_text())[rel]["age_ulp_step"]
        assert math.nextafter(ours, math.inf * step) != ours


def test_demo_output_reads_with_the_project_reader(demo_out: Path) -> None:
    from scehr.schemas.featureset import FEATURE_SETS
    from scehr.training.data.reader import read_timeseries

    files = sorted((demo_out / "in-hospital-mortality" / "train").glob("*_timeseries.csv"))
    fs = FEATURE_SETS["benchmark76-48h"]
    obs, _ = read_timeseries(files, fs, progress=False)
    eye = [v.benchmark_name for v in fs.variables].index("Glascow coma scale eye opening")
    none = fs.variables[eye].category_index("None")
    assert ((obs.channel == eye) & (obs.value == none)).any()  # "None" read as a category


def test_paths_with_quotes(fixture_out: Path, tmp_path: Path) -> None:
    raw = write_raw(tmp_path / "raw data's copy", lower_gz=False)
    out = tmp_path / "o'brien"
    extract(raw, out, memory_limit="512MB", threads=1, progress=QUIET)
    assert compare_trees(out, fixture_out).equal
