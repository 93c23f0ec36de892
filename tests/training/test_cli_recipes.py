"""`scehr train` without --config names the recipes that built the shipped models of that task,
and only that task's (a landmark recipe shares its outcome's file-name prefix)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scehr.training.cli import no_recipe_note

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("task", "named", "not_named"), [
    ("mortality", "configs/default_mortality.toml", "default_mortality_landmark"),
    ("mortality-landmark", "configs/default_mortality_landmark.toml", "default_mortality.toml"),
])
def test_the_note_names_the_task_s_own_recipes(task: str, named: str, not_named: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    note = no_recipe_note(task)
    assert named in note and not_named not in note, note
    assert os.path.isfile(REPO / named)
