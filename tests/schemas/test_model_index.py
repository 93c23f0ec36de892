"""models/index.json: one reader/writer; entries upsert, the first model of a task is default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas.model_index import (
    IndexEntry,
    MetricCI,
    ModelIndex,
    ModelIndexError,
    read_index,
    read_index_or_empty,
    write_index,
)

REPO = Path(__file__).resolve().parents[2]


def test_the_shipped_index_reads_and_writes_back_identically(tmp_path: Path) -> None:
    index = read_index(REPO / "models")
    write_index(tmp_path, index)
    assert json.loads((tmp_path / "index.json").read_text()) == json.loads(
        (REPO / "models" / "index.json").read_text())
    assert index.entry("mortality", "1.0.0").feature_set == "benchmark76-48h"  # type: ignore


def test_upsert_replaces_and_keeps_the_first_default(tmp_path: Path) -> None:
    index = read_index_or_empty(tmp_path)
    assert index == ModelIndex()
    index.upsert(IndexEntry(task="mortality", version="2", path="mortality/2",
                            metrics={"auroc": MetricCI(value=0.8, low=0.7, high=0.9)}))
    index.upsert(IndexEntry(task="mortality", version="1", path="mortality/1"))
    index.upsert(IndexEntry(task="mortality", version="2", path="mortality/2b"))
    assert [(e.version, e.path) for e in index.models] == [("1", "mortality/1"),
                                                           ("2", "mortality/2b")]
    assert index.defaults == {"mortality": "2"}
    index.upsert(IndexEntry(task="mortality", version="1", path="mortality/1"),
                 make_default=True)
    assert index.defaults == {"mortality": "1"}
    write_index(tmp_path, index)
    assert read_index(tmp_path) == index


def test_missing_or_invalid_index_names_the_rule(tmp_path: Path) -> None:
    with pytest.raises(ModelIndexError) as e:
        read_index(tmp_path)
    assert e.value.rule == "index_missing"
    (tmp_path / "index.json").write_text('{"defaults": 3}')
    with pytest.raises(ModelIndexError) as e:
        read_index(tmp_path)
    assert e.value.rule == "index_invalid"
