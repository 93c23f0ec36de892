"""The task registry: names, aliases, and that every task points at things that exist."""

from __future__ import annotations

import dataclasses

import pytest

from scehr.schemas.featureset import FEATURE_SETS, TASK_FEATURE_SETS
from scehr.schemas.manifest import Manifest
from scehr.schemas.tasks import TASK_NAMES, TASK_SPECS, task_spec


def test_every_task_names_an_existing_feature_set_with_its_window() -> None:
    for spec in TASK_SPECS.values():
        fs = FEATURE_SETS[spec.feature_set]
        assert TASK_FEATURE_SETS[spec.name] is fs
        assert fs.window_hours == spec.window_hours
        assert spec.dynamic_length == (spec.window_hours is None)
        assert len(spec.label_names) == 1 or spec.multi_label


def test_aliases_resolve_and_unknown_tasks_name_the_choices() -> None:
    assert task_spec("IHM").name == "mortality" and task_spec("phenotyping").name == "phenotypes"
    with pytest.raises(ValueError, match="unknown task 'los'; expected one of mortality, "
                                         "phenotypes"):
        task_spec("los")


def test_specs_are_frozen_and_the_manifest_lists_the_same_tasks() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        task_spec("mortality").headline_metric = "auprc"  # type: ignore[misc]
    schema = Manifest.model_json_schema()
    assert schema["properties"]["task"]["enum"] == list(TASK_NAMES)
