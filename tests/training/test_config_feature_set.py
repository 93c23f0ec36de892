"""A run's feature set: the task's by default, another by name, refused when it cannot fit."""

from __future__ import annotations

import dataclasses
import json

import pytest

from scehr.schemas.featureset import BENCHMARK_48H, BENCHMARK_STAY
from scehr.training.config import TrainConfig


def test_default_is_the_tasks_feature_set() -> None:
    assert TrainConfig(task="mortality").features() is BENCHMARK_48H
    assert TrainConfig(task="phenotypes").features() is BENCHMARK_STAY


def test_the_full_physionet_set_is_accepted_for_mortality_and_recorded_with_its_hash() -> None:
    from scehr.schemas.featureset import FEATURE_SETS, FeatureSet

    fs = TrainConfig(task="mortality", feature_set="physionet2012-full").features()
    assert fs is FEATURE_SETS["physionet2012-full"] and fs.n_channels == 39
    assert FeatureSet.from_dict(fs.manifest_dict()) == fs  # as export writes, service reads
    with pytest.raises(ValueError, match=r"covers window_hours=48\.0, the phenotypes task"):
        TrainConfig(task="phenotypes", feature_set="physionet2012-full")


def test_unknown_or_misfitting_feature_sets_fail_with_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown feature_set 'labs'; known: benchmark76-48h"):
        TrainConfig(task="mortality", feature_set="labs")
    with pytest.raises(ValueError, match="covers window_hours=None, the mortality task needs 48"):
        TrainConfig(task="mortality", feature_set="benchmark76-stay")


def test_configs_saved_before_new_keys_still_resume() -> None:
    """A config.json written before `regularizers`/`feature_set` existed reads back equal."""
    old = {k: v for k, v in dataclasses.asdict(TrainConfig()).items()
           if k not in ("regularizers", "feature_set")}
    assert TrainConfig(**json.loads(json.dumps(old))) == TrainConfig()
