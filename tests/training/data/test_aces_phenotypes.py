"""The shipped ACES phenotype task configurations: one per benchmark phenotype, each a valid
ACES configuration, and equal to what the generator writes from the benchmark's definitions (so
they never drift from them). The generator test needs ../shared/data (skipped without it)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from scehr.schemas.tasks import PHENOTYPE_LABELS
from scehr.training.data.aces_phenotypes import DIAGNOSIS_PREFIX, generate, main, slug
from scehr.training.data.layout import ccs_definitions_path
from scehr.training.data.phenotypes import code_to_group, load_ccs_definitions
from tests.conftest import REPO, needs_shared_data

CONFIGS = REPO / "configs" / "aces" / "phenotypes"
# ACES' window bound language: NULL, a reference, or a reference with -> / <- or +/- a time.
_BOUND = re.compile(r"^(NULL|(trigger|start|end|\w+\.(start|end))"
                    r"( (->|<-) \w+| [+-] \d+[smhd])?)$")


def _shipped() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(CONFIGS.glob("*.yaml"))}


def _group(text: str) -> str:
    """The phenotype a configuration names in its header."""
    found = re.search(r'phenotype "(.+)" \(CCS group', text)
    assert found, "no phenotype named in the header"
    return found.group(1)


def _check_aces_fields(cfg: dict[str, Any], name: str) -> None:
    """What ACES' TaskExtractorConfig requires of a configuration file."""
    assert set(cfg) == {"predicates", "trigger", "windows"}, name
    predicates, windows = cfg["predicates"], cfg["windows"]
    for pred, spec in predicates.items():
        assert re.fullmatch(r"\w+", pred), (name, pred)
        code = spec["code"]
        assert isinstance(code, dict) and len(code) == 1, (name, pred)
        ((kind, value),) = code.items()
        assert kind in ("regex", "any"), (name, pred)
        assert value and (isinstance(value, str) if kind == "regex" else all(
            isinstance(v, str) for v in value)), (name, pred)
    assert cfg["trigger"] in predicates, name
    labels, indexes = [], []
    for win, spec in windows.items():
        assert {"start", "end", "start_inclusive", "end_inclusive"} <= set(spec), (name, win)
        assert set(spec) <= {"start", "end", "start_inclusive", "end_inclusive", "has",
                             "label", "index_timestamp"}, (name, win)
        for bound in (spec["start"], spec["end"]):
            text = "NULL" if bound is None else str(bound)
            assert _BOUND.match(text), (name, win, text)
            for ref in re.findall(r"(?:->|<-) (\w+)", text):
                assert ref in predicates, (name, win, ref)
        assert isinstance(spec["start_inclusive"], bool), (name, win)
        assert isinstance(spec["end_inclusive"], bool), (name, win)
        for pred, bounds in spec.get("has", {}).items():
            assert pred in predicates and re.fullmatch(r"\((None|\d+), (None|\d+)\)", bounds), (
                name, win, pred)
        if "label" in spec:
            labels.append(spec["label"])
        if "index_timestamp" in spec:
            indexes.append(spec["index_timestamp"])
    assert labels == ["phenotype"], name
    assert indexes in (["start"], ["end"]), name


def test_every_benchmark_phenotype_has_one_valid_configuration() -> None:
    shipped = _shipped()
    assert sorted(shipped) == sorted(f"{slug(g)}.yaml" for g in PHENOTYPE_LABELS)
    assert sorted(_group(t) for t in shipped.values()) == sorted(PHENOTYPE_LABELS)
    for name, text in shipped.items():
        assert slug(_group(text)) + ".yaml" == name
        cfg = yaml.safe_load(text)
        _check_aces_fields(cfg, name)
        codes = cfg["predicates"]["phenotype"]["code"]["any"]
        assert codes and all(c.startswith(DIAGNOSIS_PREFIX) for c in codes), name
        assert len(set(codes)) == len(codes), name


@needs_shared_data
def test_shipped_configurations_are_the_generators_output(tmp_path: Path) -> None:
    definitions = load_ccs_definitions(ccs_definitions_path())
    assert generate(definitions) == _shipped()
    assert main([str(tmp_path)]) == 0
    assert {p.name: p.read_text() for p in tmp_path.glob("*.yaml")} == _shipped()
    # each label's codes are exactly the benchmark's codes of that group
    group_of = code_to_group(definitions)
    for text in _shipped().values():
        codes = yaml.safe_load(text)["predicates"]["phenotype"]["code"]["any"]
        group = _group(text)
        assert {c.removeprefix(DIAGNOSIS_PREFIX) for c in codes} == {
            c for c, g in group_of.items() if g == group}


@needs_shared_data
def test_generator_removes_stale_configurations(tmp_path: Path) -> None:
    (tmp_path / "renamed_group.yaml").write_text("predicates: {}\n")
    main([str(tmp_path)])
    assert not (tmp_path / "renamed_group.yaml").exists()
    assert len(list(tmp_path.glob("*.yaml"))) == len(PHENOTYPE_LABELS)


def test_slug_is_a_plain_file_name() -> None:
    assert slug("Respiratory failure; insufficiency; arrest (adult)") == (
        "respiratory_failure_insufficiency_arrest_adult")
    with pytest.raises(AssertionError):
        _group("no header")
