"""Feature sets are versioned data: explicit ids, frozen content, checked against the catalog."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scehr.schemas.featureset import (
    BENCHMARK_48H,
    BENCHMARK_STAY,
    FEATURE_SET_FILE,
    FeatureSet,
    UnknownVariableError,
    load_feature_sets,
)

#: The published sets' content hashes: a change to the set or to any of its variables'
#: catalog entries changes these (then publish a new version instead).
PUBLISHED = {
    "benchmark76-48h": "a7924513a93c81e414f24f7e982afb84312405a25c9f77a180df6e2243eb163b",
    "benchmark76-stay": "32bd56b14644907965111bf1af2a49cc60655a8de3620073e2499adbe9383864",
    "physionet2012-full": "045251589592ac7cab08141bce346ae153d36cba578ec289fb3158bc28b9f589",
}


def test_the_full_physionet_set_keeps_its_content() -> None:
    from scehr.schemas.featureset import FEATURE_SETS

    fs = FEATURE_SETS["physionet2012-full"]
    assert fs.sha256 == PUBLISHED[fs.name]
    assert fs.n_channels == 39 and fs.n_features == 93 and fs.window_hours == 48.0


def test_benchmark_sets_list_their_17_variables_and_keep_their_content() -> None:
    raw = json.loads(FEATURE_SET_FILE.read_text())["feature_sets"]
    for fs in (BENCHMARK_48H, BENCHMARK_STAY):
        assert len(raw[fs.name]["variables"]) == 17 and fs.n_features == 76
        assert fs.sha256 == PUBLISHED[fs.name]


def test_an_unknown_variable_fails_at_load_naming_set_and_variable(tmp_path: Path) -> None:
    raw = json.loads(FEATURE_SET_FILE.read_text())
    raw["feature_sets"]["labs-1"] = {**raw["feature_sets"]["benchmark76-48h"],
                                     "variables": ["heart_rate", "procalcitonin"]}
    path = tmp_path / "sets.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(UnknownVariableError, match="feature set 'labs-1' version 1 lists "
                                                   "variable 'procalcitonin', which the variable "
                                                   "catalog"):
        load_feature_sets(path)


def test_a_new_set_is_data_only(tmp_path: Path) -> None:
    raw = json.loads(FEATURE_SET_FILE.read_text())
    raw["feature_sets"]["vitals-6h"] = {"version": "1", "variables": ["heart_rate", "ph"],
                                        "timestep": 1.0, "window_hours": 6.0, "max_hours": 6.0}
    path = tmp_path / "sets.json"
    path.write_text(json.dumps(raw))
    sets = load_feature_sets(path)
    assert sets["vitals-6h"].n_features == 4
    assert sets["benchmark76-48h"].sha256 == PUBLISHED["benchmark76-48h"]


def test_manifest_round_trip_checks_the_content_hash() -> None:
    d = BENCHMARK_48H.manifest_dict()
    assert d["sha256"] == BENCHMARK_48H.sha256
    assert FeatureSet.from_dict(d) == BENCHMARK_48H
    legacy = {k: v for k, v in d.items() if k != "sha256"}  # manifests before the hash
    assert FeatureSet.from_dict(legacy) == BENCHMARK_48H
    with pytest.raises(ValueError, match="the variable catalog changed since the model"):
        FeatureSet.from_dict({**d, "sha256": "0" * 64})


def test_a_set_whose_variables_share_a_payload_name_is_refused() -> None:
    # the merged benchmark channel and the invasive one both read LOINC 76213-8
    with pytest.raises(ValueError, match="'76213-8' names both diastolic_bp and "
                                         "invasive_diastolic_bp"):
        FeatureSet("mixed", "1", ("diastolic_bp", "invasive_diastolic_bp"))
