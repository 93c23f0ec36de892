"""eICU demo converter: ICD-9 normalisation, the h+1 time rule, labels, a real subset."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from scehr.training.data import load_split
from scehr.training.data.eicu_demo import (
    convert_eicu_demo,
    grid_time,
    hospital_groups,
    parse_age,
)
from scehr.training.data.layout import ccs_definitions_path, data_dir
from scehr.training.data.phenotypes import (
    PHENOTYPE_LABELS,
    benchmark_groups,
    icd9_codes,
    icd9_long,
    label_matrix,
    load_ccs_definitions,
)

SRC = data_dir() / "eicu-demo"
HAVE_CCS = ccs_definitions_path().is_file()
needs_data = pytest.mark.skipif(not (SRC.is_dir() and HAVE_CCS),
                                reason=f"needs the eICU demo at {SRC} and the benchmark "
                                "resources (absent; set SCEHR_DATA_DIR)")


@pytest.fixture(autouse=True)
def _no_cache_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCEHR_CACHE_DIR", raising=False)


def test_icd9_normalisation() -> None:
    assert icd9_codes("414.00, I25.10") == ["41400"]
    assert icd9_codes("038.9, A41.9") == ["0389"]
    assert icd9_codes("V45.81, Z95.1") == ["V4581"]
    assert icd9_codes("E980.2, 965.00, T40.60") == ["E9802", "96500"]
    assert icd9_codes("E86.0") == []  # ICD-10 E code
    assert icd9_codes("31.1") == []  # ICD-9 procedure code, not a diagnosis
    assert icd9_codes("486") == ["486"]
    assert icd9_codes(float("nan")) == [] and icd9_codes(None) == []
    stay, codes = icd9_long(np.array([0, 1, 2]),
                            pd.Series(["414.00, I25.10", None, "584.9, E930.8, N17.9"]))
    assert stay.tolist() == [0, 2, 2] and codes.tolist() == ["41400", "5849", "E9308"]


def test_label_matrix_matches_codes_exactly() -> None:
    defs = {"B group": {"use_in_benchmark": True, "codes": ["41400", "4140"]},
            "A group": {"use_in_benchmark": True, "codes": ["5849"]},
            "C unused": {"use_in_benchmark": False, "codes": ["486"]}}
    assert benchmark_groups(defs) == ("A group", "B group")
    y = label_matrix(np.array([0, 0, 1, 2]), ["41400", "486", "414", "5849"], 4, defs)
    assert y.tolist() == [[0, 1], [0, 0], [1, 0], [0, 0]]


def test_grid_time_rule() -> None:
    # hour h summarises [h, h+1): stamped at h+1 (same benchmark bin h), never after the end
    t = grid_time(np.array([0, 1, 47, 20]), np.array([100.0, 100.0, 100.0, 20.5]))
    assert t.tolist() == [1.0, 2.0, 48.0, 20.5]
    assert (np.trunc(t - 1e-6).astype(int) == [0, 1, 47, 20]).all()


def test_parse_age() -> None:
    assert np.allclose(parse_age(pd.Series(["> 89", "45", None, ""])), [90, 45, np.nan, np.nan],
                       equal_nan=True)


@needs_data
def test_label_order_is_the_benchmark_yaml_order() -> None:
    assert benchmark_groups(load_ccs_definitions()) == PHENOTYPE_LABELS


@pytest.mark.realdata
@needs_data
def test_real_subset(tmp_path: Path) -> None:
    prov = convert_eicu_demo(SRC, tmp_path, limit_patients=120, progress=False)
    ph = tmp_path / "phenotyping"
    head = (ph / "train" / "listfile.csv").read_text().splitlines()[0].split(",")
    assert head[:2] == ["stay", "period_length"] and tuple(head[2:]) == PHENOTYPE_LABELS
    assert prov["phenotyping"]["kept"] > 50
    assert prov["phenotyping"]["excluded_no_icd9_code"] > 0
    a = load_split(tmp_path, "phenotypes", "train", progress=False)
    assert a.y.shape[1] == 25 and a.y.sum() > 0 and a.x.shape[1] <= 240
    fio2 = a.feature_set.column_names().index("fio2")
    seen = a.x[..., a.feature_set.n_value_columns + 2] == 1
    assert (a.x[..., fio2][seen] <= 1.0).all()  # percent converted to a fraction
    demo = pd.read_csv(ph / "train" / "demographics.csv")
    assert {"stay", "age", "sex_male", "uniquepid"} <= set(demo.columns)
    # a patient's stays are all on one side of the split
    pids = lambda p: set(pd.read_csv(ph / p / "demographics.csv")["uniquepid"])  # noqa: E731
    assert not pids("train") & pids("test")
    # first row of a stay: nothing stamped before hour 1 except height/weight at 0
    f = next((ph / "train").glob("*_timeseries.csv"))
    times = pd.read_csv(f)["Hours"].to_numpy()
    assert times[times > 0].min() >= 1.0
    m = load_split(tmp_path, "mortality", "test", progress=False)
    assert m.x.shape[1:] == (48, 76)
    assert json.loads((tmp_path / "provenance.json").read_text())["converter_version"]


def test_hospitals_sharing_a_patient_form_one_group() -> None:
    hospitals = np.array([1, 2, 2, 3, 4, 4, 5])
    patients = np.array(["a", "a", "b", "c", "d", "e", "e"])
    g = hospital_groups(hospitals, patients)
    assert g[0] == g[1] == g[2]  # patient a was in hospitals 1 and 2
    assert g[4] == g[5] == g[6]  # patient e was in hospitals 4 and 5
    assert len({g[0], g[3], g[4]}) == 3


@pytest.mark.realdata
@needs_data
def test_hospital_split_keeps_every_hospital_and_patient_on_one_side(tmp_path: Path) -> None:
    prov = convert_eicu_demo(SRC, tmp_path, limit_patients=600, progress=False,
                             split_by="hospital")
    assert prov["split"]["by"] == "hospitalid"
    for task in ("in-hospital-mortality", "phenotyping"):
        d = tmp_path / task
        demo = pd.concat([pd.read_csv(d / p / "demographics.csv")
                          for p in ("train", "test")]).set_index("stay")
        sides = {s: list(pd.read_csv(d / f"{s}_listfile.csv")["stay"])
                 for s in ("train", "val", "test")}
        for key in ("hospitalid", "uniquepid"):
            held = {s: set(demo.loc[stays, key]) for s, stays in sides.items()}
            assert all(held.values()), (task, key)
            assert not held["train"] & held["val"], (task, key)
            assert not held["train"] & held["test"], (task, key)
            assert not held["val"] & held["test"], (task, key)


def test_wrong_source_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"patient\.csv\.gz"):
        convert_eicu_demo(tmp_path, tmp_path / "out", ccs_definitions=tmp_path / "x.yaml")


def test_labs_map_onto_the_same_ids_in_the_full_feature_set() -> None:
    from scehr.schemas.featureset import BENCHMARK_STAY, FEATURE_SETS
    from scehr.training.data.eicu_demo import empty_channels, grid_targets

    full = grid_targets(FEATURE_SETS["physionet2012-full"])
    assert full["bun"] == ("bun", 1.0) and full["crea"] == ("creatinine", 1.0)
    assert full["lact"] == ("lactate", 1.0) and full["plt"] == ("platelets", 1.0)
    assert full["sbp"] == ("noninvasive_systolic_bp", 1.0) and full["fio2"] == ("fio2", 0.01)
    assert "o2sat" not in full  # pulse oximetry: the full set has SaO2 only
    assert set(empty_channels(FEATURE_SETS["physionet2012-full"])) == {
        "invasive_systolic_bp", "invasive_diastolic_bp", "invasive_mean_bp", "gcs_total",
        "mechanical_ventilation", "sao2", "hematocrit", "cholesterol", "troponin_i"}
    bench = grid_targets(BENCHMARK_STAY)
    assert bench["sbp"] == ("systolic_bp", 1.0) and bench["o2sat"] == ("o2_saturation", 1.0)
    assert len(bench) == 10  # the benchmark conversion is unchanged
