"""The channel catalog matches the benchmark's own resource files."""

from __future__ import annotations

import csv
import json

import pytest

from scehr.schemas.variables import BY_ID, CATALOG, VARIABLES, lookup, name_index
from tests.conftest import SHARED_DATA, needs_shared_data

RES = SHARED_DATA / "mimic3-benchmarks-resources"


@needs_shared_data
def test_categories_order_and_normals_match_discretizer_config() -> None:
    cfg = json.loads((RES / "mimic3models/resources/discretizer_config.json").read_text())
    assert [v.benchmark_name for v in VARIABLES] == cfg["id_to_channel"]
    for v in VARIABLES:
        assert v.is_categorical == cfg["is_categorical_channel"][v.benchmark_name]
        assert v.normal == cfg["normal_values"][v.benchmark_name]
        if v.is_categorical:
            assert list(v.categories) == cfg["possible_values"][v.benchmark_name]


@needs_shared_data
def test_ranges_match_variable_ranges_csv_case_insensitively() -> None:
    with open(RES / "mimic3benchmark/resources/variable_ranges.csv") as f:
        rows = {r["LEVEL2"].lower(): r for r in csv.DictReader(f) if r["OUTLIER LOW"]}
    for v in VARIABLES:
        r = rows[v.benchmark_name.lower()]
        got = (v.ranges.outlier_low, v.ranges.valid_low, v.ranges.valid_high,
               v.ranges.outlier_high)
        want = tuple(float(r[k]) for k in ("OUTLIER LOW", "VALID LOW", "VALID HIGH",
                                           "OUTLIER HIGH"))
        assert got == want, v.id


@needs_shared_data
def test_every_alias_maps_to_a_benchmark_string_with_the_same_score() -> None:
    info = json.loads((RES / "mimic3models/resources/channel_info.json").read_text())
    for v in VARIABLES:
        values = info[v.benchmark_name].get("values")
        for alias, target in v.category_aliases.items():
            assert target in v.categories
            if values and alias.replace(".0", "").isdigit():
                assert values[target] == int(float(alias)), (v.id, alias)


def test_unit_conversions() -> None:
    assert BY_ID["temperature"].convert(98.6, "F") == pytest.approx(37.0)
    # the benchmark's conversions, which its training data went through
    assert BY_ID["weight"].convert(100, "lb") == 100 * 0.453592
    assert BY_ID["weight"].convert(32, "oz") == 32 / 16.0 * 0.453592
    assert BY_ID["height"].convert(70, "in") == 178.0  # whole cm, half to even
    assert BY_ID["height"].convert(62.5, "in") == 159.0
    assert BY_ID["temperature"].convert(98.6, "?F") == BY_ID["temperature"].convert(98.6, "F")
    assert BY_ID["fio2"].convert(40, "%") == pytest.approx(0.40)
    assert BY_ID["glucose"].convert(5.5, "mmol/L") == pytest.approx(99.09, abs=0.01)
    assert BY_ID["heart_rate"].convert(80, None) == 80


def test_unit_required_and_unknown_unit_are_errors() -> None:
    with pytest.raises(ValueError, match="unit is required for glucose"):
        BY_ID["glucose"].convert(100, None)
    with pytest.raises(ValueError, match="not accepted for temperature"):
        BY_ID["temperature"].convert(37, "K")


def test_category_aliases_and_unknown_categories() -> None:
    total = BY_ID["gcs_total"]
    assert total.categories[total.category_index(15)] == "15"
    assert total.categories[total.category_index("15.0")] == "15"
    assert BY_ID["gcs_eye"].categories[BY_ID["gcs_eye"].category_index(4)] == "4 Spontaneously"
    with pytest.raises(ValueError, match="not a category of gcs_total"):
        total.category_index(16)
    with pytest.raises(ValueError):
        BY_ID["gcs_eye"].category_index(True)


def test_lookup_by_id_benchmark_name_and_case() -> None:
    assert lookup("Heart Rate") is lookup("heart rate") is lookup("heart_rate")
    with pytest.raises(KeyError, match="unknown variable"):
        lookup("procalcitonin")


def test_docs_variables_md_is_current() -> None:
    from pathlib import Path

    from scehr.schemas.variables import catalog_markdown

    doc = Path(__file__).resolve().parents[2] / "docs" / "variables.md"
    assert doc.read_text() == catalog_markdown() + "\n", (
        "regenerate with: python -m scehr.schemas.variables > docs/variables.md")


def _loinc_check_digit_ok(code: str) -> bool:
    """LOINC's mod-10 check digit (the Luhn scheme) over the code's number part."""
    number, check = code.split("-")
    total = 0
    for i, d in enumerate(int(c) for c in reversed(number)):
        d = d * 2 if i % 2 == 0 else d
        total += d - 9 if d > 9 else d
    return (10 - total % 10) % 10 == int(check)


def test_every_loinc_code_is_well_formed() -> None:
    codes = [c for v in CATALOG for c in v.loinc_codes]
    assert len(codes) > 60
    assert all(_loinc_check_digit_ok(c) for c in codes), [c for c in codes
                                                         if not _loinc_check_digit_ok(c)]
    assert not _loinc_check_digit_ok("2160-1")


def test_names_are_unique_in_the_catalog_and_in_every_feature_set() -> None:
    from scehr.schemas.featureset import FEATURE_SETS

    for fs in FEATURE_SETS.values():
        index = name_index(fs.variables)  # raises on a name two variables share
        for v in fs.variables:
            assert index[v.id] == index[v.loinc or v.id] == fs.variables.index(v)
    assert lookup("bun") is lookup("BUN") is lookup("Blood urea nitrogen")


def test_lab_unit_conversions() -> None:
    assert BY_ID["creatinine"].convert(88.42, "umol/L") == pytest.approx(1.0)
    assert BY_ID["bun"].convert(7.14, "mmol/L") == pytest.approx(20.0, abs=0.01)
    assert BY_ID["lactate"].convert(18.0, "mg/dL") == pytest.approx(2.0, abs=0.01)
    assert BY_ID["bilirubin"].convert(17.104, "umol/L") == pytest.approx(1.0)
    assert BY_ID["magnesium"].convert(1.0, "mmol/L") == pytest.approx(2.4305)
    assert BY_ID["magnesium"].convert(2.0, "mEq/L") == pytest.approx(2.4305)
    assert BY_ID["cholesterol"].convert(5.0, "mmol/L") == pytest.approx(193.3, abs=0.1)
    assert BY_ID["albumin"].convert(35, "g/L") == pytest.approx(3.5)
    assert BY_ID["pao2"].convert(13.3, "kPa") == pytest.approx(99.76, abs=0.01)
    assert BY_ID["troponin_t"].convert(14, "ng/L") == pytest.approx(0.014)
    assert BY_ID["hematocrit"].convert(0.42, "L/L") == pytest.approx(42.0)
    assert BY_ID["sodium"].convert(140, None) == 140 == BY_ID["sodium"].convert(140, "mEq/L")
    with pytest.raises(ValueError, match="not accepted for lactate"):
        BY_ID["lactate"].convert(2, "g/L")
