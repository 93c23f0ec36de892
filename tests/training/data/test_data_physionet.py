"""PhysioNet 2012 converter: hand-made records for the rules, real records when present."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from scehr.schemas.featureset import BENCHMARK_48H, FEATURE_SETS
from scehr.schemas.variables import BY_ID, VARIABLES, lookup
from scehr.training.data import load_split
from scehr.training.data.layout import data_dir
from scehr.training.data.physionet2012 import (
    DESCRIPTOR_CHANNELS,
    PARAMETER_MAP,
    convert_physionet2012,
    empty_channels,
    parse_records,
)

FS = BENCHMARK_48H
CH = {v.id: i for i, v in enumerate(FS.variables)}
FULL = FEATURE_SETS["physionet2012-full"]
FCH = {v.id: i for i, v in enumerate(FULL.variables)}
SRC = data_dir() / "physionet2012"


@pytest.fixture(autouse=True)
def _no_cache_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCEHR_CACHE_DIR", raising=False)


def _record(rid: int, rows: list[str], height: str = "-1", weight: str = "80",
            gender: str = "1") -> bytes:
    desc = [f"00:00,RecordID,{rid}", "00:00,Age,70", f"00:00,Gender,{gender}",
            f"00:00,Height,{height}", "00:00,ICUType,2", f"00:00,Weight,{weight}"]
    return ("\n".join(["Time,Parameter,Value", *desc, *rows]) + "\n").encode()


def _body(data: bytes) -> bytes:
    return data.split(b"\n", 1)[1]


def test_rules_on_hand_made_records() -> None:
    r1 = _record(1, [
        "00:30,DiasABP,60", "00:30,NIDiasABP,55",  # same time: invasive wins
        "01:00,NISysABP,120",  # non-invasive alone: kept
        "01:00,SysABP,-1",  # invasive implausible: the NI value stays
        "01:00,NIMAP,80", "01:00,MAP,81",
        "02:15,,1.9",  # empty parameter name: dropped
        "02:15,GCS,15", "03:00,GCS,2", "04:00,Urine,30", "05:00,Weight,82",
        "06:00,Temp,-17.8", "07:00,FiO2,0.5", "07:00,SaO2,97",
    ], height="170.2")
    r2 = _record(2, [], weight="-1", gender="0")  # no time series, weight missing
    obs, demo, stats = parse_records(np.array([1, 2]), [_body(r1), _body(r2)], FS)
    cells = {(int(s), float(t), int(c)): float(v) for s, t, c, v in
             zip(obs.stay, obs.time, obs.channel, obs.value, strict=True)}
    assert cells[(0, 0.5, CH["diastolic_bp"])] == 60.0
    assert sum(1 for k in cells if k[2] == CH["diastolic_bp"]) == 1
    assert cells[(0, 1.0, CH["systolic_bp"])] == 120.0
    assert cells[(0, 1.0, CH["mean_bp"])] == 81.0
    assert cells[(0, 2.25, CH["gcs_total"])] == FS.variables[CH["gcs_total"]].categories.index(
        "15")
    assert (0, 3.0, CH["gcs_total"]) not in cells  # GCS 2 is not a category
    assert cells[(0, 0.0, CH["height"])] == 170.2 and cells[(0, 0.0, CH["weight"])] == 80.0
    assert cells[(0, 5.0, CH["weight"])] == 82.0
    assert (0, 6.0, CH["temperature"]) not in cells  # -17.8 °C: below the outlier bound
    assert cells[(0, 7.0, CH["fio2"])] == 0.5 and cells[(0, 7.0, CH["o2_saturation"])] == 97
    assert not (obs.stay == 1).any()  # record 2: weight -1 is missing, no series
    assert stats["empty_parameter_rows_dropped"] == 1
    assert stats["invalid_category_dropped"] == 1
    assert stats["noninvasive_superseded_by_invasive"] == 2  # DiasABP and MAP
    assert stats["records_without_timeseries"] == [2]
    assert stats["implausible"]["systolic_bp"] == 1 and stats["dropped"]["temperature"] == 1
    assert demo["sex_male"].tolist() == [1.0, 0.0] and np.isnan(demo["weight"][1])
    assert np.isnan(demo["height"][1]) and demo["height"][0] == 170.2


def test_catalog_has_every_physionet_series_with_unit_range_normal() -> None:
    assert len(PARAMETER_MAP) == 37
    for name, candidates in PARAMETER_MAP.items():
        var = BY_ID[candidates[0][0]]
        assert var.plausible or var.ranges or var.is_categorical, name
        assert var.normal and (var.unit or var.is_categorical), name
        assert lookup(name) is var or var in VARIABLES, name  # the PhysioNet name is an alias
    assert BY_ID[DESCRIPTOR_CHANNELS["ICUType"]].categories == ("1", "2", "3", "4")


def test_full_feature_set_keeps_every_series_apart() -> None:
    assert empty_channels(FULL) == []
    r1 = _record(1, [
        "00:30,DiasABP,60", "00:30,NIDiasABP,55",  # both kept: two variables
        "01:00,HR,0", "01:00,HR,88",  # a zero heart rate is an artefact
        "01:30,pH,735", "02:00,BUN,20", "02:00,Lactate,3.1", "02:00,MechVent,1",
        "03:00,SaO2,97", "03:00,Urine,0", "04:00,Mg,2.1", "04:00,PaCO2,0.3",
    ])
    obs, _, stats = parse_records(np.array([1]), [_body(r1)], FULL)
    cells = {(float(t), FULL.variables[int(c)].id): float(v) for t, c, v in
             zip(obs.time, obs.channel, obs.value, strict=True)}
    assert cells[(0.5, "invasive_diastolic_bp")] == 60.0
    assert cells[(0.5, "noninvasive_diastolic_bp")] == 55.0
    assert cells[(1.0, "heart_rate")] == 88.0 and len([k for k in cells if k[1] ==
                                                     "heart_rate"]) == 1
    assert cells[(1.5, "ph")] == pytest.approx(7.35)
    assert cells[(2.0, "bun")] == 20 and cells[(2.0, "lactate")] == 3.1
    assert cells[(2.0, "mechanical_ventilation")] == 1 and cells[(3.0, "sao2")] == 97
    assert cells[(3.0, "urine_output")] == 0.0  # anuria is physiological
    assert cells[(4.0, "magnesium")] == 2.1 and (4.0, "paco2") not in cells
    icu = FULL.variables[FCH["icu_type"]]
    assert cells[(0.0, "icu_type")] == icu.categories.index("2")  # the descriptor, at t = 0
    assert stats["implausible"]["heart_rate"] == 1 and stats["implausible"]["paco2"] == 1
    assert stats["rescaled"]["ph"] == 1 and stats["noninvasive_superseded_by_invasive"] == 0
    assert stats["unmapped_parameter_rows"] == 0


def test_descriptors_interleaved_with_measurements() -> None:
    """Descriptors are the first 00:00 row of each name, wherever they stand (set c 153070)."""
    text = "\n".join([
        "Time,Parameter,Value", "00:00,RecordID,7", "00:00,Age,82", "00:00,ICUType,1",
        "00:00,pH,7.52", "00:00,Gender,0", "00:00,Height,165", "00:00,PaCO2,52",
        "00:00,Weight,62.5", "00:07,HR,70", "03:00,Weight,64",
    ]) + "\n"
    obs, demo, _ = parse_records(np.array([7]), [_body(text.encode())], FS)
    assert demo["sex_male"].tolist() == [0.0]
    assert demo["height"].tolist() == [165.0] and demo["weight"].tolist() == [62.5]
    assert demo["icu_type"].tolist() == [1.0] and demo["age"].tolist() == [82.0]
    cells = {(float(t), int(c)): float(v) for t, c, v in
             zip(obs.time, obs.channel, obs.value, strict=True)}
    assert cells[(0.0, CH["height"])] == 165.0 and cells[(0.0, CH["weight"])] == 62.5
    assert cells[(0.0, CH["ph"])] == 7.52 and cells[(3.0, CH["weight"])] == 64.0
    # The same record with the descriptors first parses to the same result.
    ordered = "\n".join([
        "Time,Parameter,Value", "00:00,RecordID,7", "00:00,Age,82", "00:00,Gender,0",
        "00:00,Height,165", "00:00,ICUType,1", "00:00,Weight,62.5", "00:00,pH,7.52",
        "00:00,PaCO2,52", "00:07,HR,70", "03:00,Weight,64",
    ]) + "\n"
    obs2, demo2, _ = parse_records(np.array([7]), [_body(ordered.encode())], FS)
    pd.testing.assert_frame_equal(demo, demo2)
    assert sorted(cells.items()) == sorted(
        ((float(t), int(c)), float(v)) for t, c, v in
        zip(obs2.time, obs2.channel, obs2.value, strict=True))


def _fake_source(root: Path) -> Path:
    root.mkdir()
    for k, s in enumerate("abc"):
        ids = [1000 * (k + 1) + i for i in range(10)]
        with tarfile.open(root / f"set-{s}.tar.gz", "w:gz") as tf:
            for i, rid in enumerate(ids):
                rows = [f"00:{10 + i:02d},HR,{70 + i}", f"47:59,HR,{90 + i}",
                        "12:00,DiasABP,60", "12:00,NIDiasABP,50"]
                data = _record(rid, rows)
                info = tarfile.TarInfo(f"set-{s}/{rid}.txt")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
        pd.DataFrame({"RecordID": ids, "SAPS-I": 1, "SOFA": 1, "Length_of_stay": 5,
                      "Survival": -1, "In-hospital_death": [int(i < 3) for i in range(10)]}
                     ).to_csv(root / f"Outcomes-{s}.txt", index=False)
    return root


def test_convert_hand_made_source(tmp_path: Path) -> None:
    src = _fake_source(tmp_path / "src")
    prov = convert_physionet2012(src, tmp_path / "out", progress=False, val_fraction=0.2)
    tdir = tmp_path / "out" / "in-hospital-mortality"
    text = (tdir / "train" / "1000_episode1_timeseries.csv").read_text().splitlines()
    assert text[0].startswith("Hours,Capillary refill rate,")
    assert text[1].startswith("0.0,") and text[2].startswith("0.16666666666666666,")
    assert ",60.0," in text[3] and ",50.0," not in text[3]
    assert prov["splits"]["test"]["stays"] == 10
    assert prov["splits"]["val"]["stays"] == 4 and prov["splits"]["val"]["positives"] == 1
    listed = pd.read_csv(tdir / "train" / "listfile.csv")
    assert len(listed) == 20 and listed["y_true"].sum() == 6
    a = load_split(tmp_path / "out", "mortality", "test", progress=False)
    assert a.x.shape == (10, 48, 76) and a.static_raw[:, 0].tolist() == [70.0] * 10
    assert (tmp_path / "out" / "provenance.json").is_file()


def test_convert_with_the_full_feature_set(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    src = _fake_source(tmp_path / "src")
    prov = convert_physionet2012(src, tmp_path / "out", progress=False, val_fraction=0.2,
                                 fs=FULL)
    assert prov["feature_set"] == {"name": FULL.name, "version": "1", "sha256": FULL.sha256}
    assert prov["mapping"]["NIDiasABP"] == "noninvasive_diastolic_bp"
    a = load_split(tmp_path / "out", "mortality", "test", FULL, progress=False)
    assert a.x.shape == (10, 48, FULL.n_features) and a.read_report["unknown_columns"] == []
    assert a.coverage[FCH["invasive_diastolic_bp"]] == 1.0
    assert a.coverage[FCH["noninvasive_diastolic_bp"]] == 1.0
    assert a.coverage[FCH["icu_type"]] == 1.0 and a.coverage[FCH["bun"]] == 0.0
    from scehr.cli import main

    assert main(["data", "inspect", str(tmp_path / "out"), "--no-cache"]) == 0  # reads the set
    assert "noninvasive_diastolic_bp" in capsys.readouterr().out  # provenance.json names


def test_wrong_source_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"set-a\.tar\.gz"):
        convert_physionet2012(tmp_path, tmp_path / "out")


@pytest.mark.realdata
@pytest.mark.skipif(not SRC.is_dir(), reason=f"needs PhysioNet 2012 data at {SRC} (absent; "
                    "set SCEHR_DATA_DIR)")
def test_real_records(tmp_path: Path) -> None:
    prov = convert_physionet2012(SRC, tmp_path, limit=20, progress=False)
    assert [s["stays"] for s in prov["sets"].values()] == [20, 20, 20]
    assert prov["sets"]["c"]["empty_parameter_rows_dropped"] > 0
    assert prov["sets"]["a"]["noninvasive_superseded_by_invasive"] > 0
    first = tmp_path / "in-hospital-mortality" / "train" / "132539_episode1_timeseries.csv"
    lines = first.read_text().splitlines()
    assert lines[1].startswith("0.11666666666666667,")  # 00:07
    assert ",15," in lines[1]  # GCS total as its category string
    a = load_split(tmp_path, "mortality", "train", progress=False)
    v = load_split(tmp_path, "mortality", "val", progress=False)
    assert len(a) + len(v) == 40 and a.x.shape[1:] == (48, 76)
    assert a.coverage[CH["heart_rate"]] == 1.0 and a.coverage[CH["gcs_eye"]] == 0.0
    assert a.dropped.sum() == 0 and a.clipped.sum() == 0  # already cleaned when written
