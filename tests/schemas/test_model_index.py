"""models/index.json: one reader/writer; versions are immutable, the default moves only when
asked and says since when, every change is reported."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import pytest

from scehr import cli as scehr_cli
from scehr.schemas.model_index import (
    IndexEntry,
    MetricCI,
    ModelIndex,
    ModelIndexError,
    add_model,
    compare_models,
    read_index,
    read_index_or_empty,
    refuse_existing,
    remove_model,
    set_default,
    write_index,
)
from tests.service.fixture_model import write_index as write_fixture_index
from tests.service.fixture_model import write_model

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


def entry(version: str) -> IndexEntry:
    return IndexEntry(task="mortality", version=version, path=f"mortality/{version}")


def test_adding_never_moves_the_default_unless_asked(tmp_path: Path) -> None:
    changes = add_model(tmp_path, entry("1.0.0"), set_default=False)
    assert changes[-1] == "default mortality: (none) -> 1.0.0"  # a first model: the default
    index = read_index(tmp_path)
    since = index.since("mortality")
    assert since is not None and since <= dt.datetime.now(dt.UTC)
    changes = add_model(tmp_path, entry("2.0.0"), set_default=False)
    assert "stays 1.0.0" in changes[-1] and "set-default mortality 2.0.0" in changes[-1]
    assert read_index(tmp_path).defaults == {"mortality": "1.0.0"}
    assert read_index(tmp_path).default_since["mortality"] == index.default_since["mortality"]
    add_model(tmp_path, entry("3.0.0"), set_default=True)
    assert read_index(tmp_path).defaults == {"mortality": "3.0.0"}
    with pytest.raises(ModelIndexError, match="immutable"):
        add_model(tmp_path, entry("2.0.0"), set_default=True)
    assert [e.version for e in read_index(tmp_path).models] == ["1.0.0", "2.0.0", "3.0.0"]


def test_refuse_existing_checks_index_and_folder(tmp_path: Path) -> None:
    add_model(tmp_path, entry("1.0.0"), set_default=False)
    with pytest.raises(ModelIndexError, match="already in"):
        refuse_existing(tmp_path, "mortality", "1.0.0", tmp_path / "mortality" / "1.0.0")
    folder = write_model(tmp_path, "mortality", "9.0.0")  # on disk, not in the index
    with pytest.raises(ModelIndexError, match="already holds a model"):
        refuse_existing(tmp_path, "mortality", "9.0.0", folder)
    refuse_existing(tmp_path, "mortality", "9.1.0", tmp_path / "mortality" / "9.1.0")


def test_set_default_and_remove(tmp_path: Path) -> None:
    for v in ("1.0.0", "2.0.0"):
        add_model(tmp_path, entry(v), set_default=False)
    assert set_default(tmp_path, "mortality", "2.0.0") == "default mortality: 1.0.0 -> 2.0.0"
    assert set_default(tmp_path, "mortality", "2.0.0").startswith("default mortality is already")
    with pytest.raises(ModelIndexError, match=r"versions: 1\.0\.0, 2\.0\.0"):
        set_default(tmp_path, "mortality", "7.0.0")
    with pytest.raises(ModelIndexError, match="is the default"):
        remove_model(tmp_path, "mortality", "2.0.0")
    message, folder = remove_model(tmp_path, "mortality", "1.0.0")
    assert message == "removed mortality 1.0.0 from the index"
    assert folder == tmp_path / "mortality" / "1.0.0"
    assert [e.version for e in read_index(tmp_path).models] == ["2.0.0"]
    assert not list(tmp_path.glob(".index.*"))  # atomic writes leave no temporary file


def test_cli_prints_every_change(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for v in ("v1", "v2"):
        write_model(tmp_path, "mortality", v)
    write_fixture_index(tmp_path, [("mortality", "v1"), ("mortality", "v2")])
    md = ["--model-dir", str(tmp_path)]
    assert scehr_cli.main(["models", "set-default", "mortality", "v2", *md]) == 0
    assert capsys.readouterr().out.strip() == "default mortality: v1 -> v2"
    assert scehr_cli.main(["models", "remove", "mortality", "v2", *md]) == 1
    assert "is the default" in capsys.readouterr().err
    assert scehr_cli.main(["models", "remove", "mortality", "v1", "--delete-files", *md]) == 0
    out = capsys.readouterr().out
    assert "removed mortality v1 from the index" in out and "deleted" in out
    assert not (tmp_path / "mortality" / "v1").exists()
    assert scehr_cli.main(["models", "list", *md]) == 0
    listing = capsys.readouterr().out
    assert "DEFAULT SINCE" in listing and "v1" not in listing.split("\n", 1)[1]
    assert json.loads((tmp_path / "index.json").read_text())["default_since"]["mortality"]


def test_the_run_folder_in_the_notes_is_a_build_stamp(tmp_path: Path) -> None:
    a = write_model(tmp_path / "a", "mortality", "1.0.0", seed=1)
    b = tmp_path / "b"
    shutil.copytree(a, b)

    def with_notes(folder: Path, notes: list[str]) -> None:
        m = json.loads((folder / "manifest.json").read_text())
        m["notes"] = notes
        (folder / "manifest.json").write_text(json.dumps(m))

    with_notes(a, ["trained by: scehr train --config runs/default-x/config.json", "n"])
    with_notes(b, ["trained by: scehr train --config runs/check-x/run/config.json", "n"])
    diffs, notes = compare_models(a, b)
    assert diffs == [] and any("another run folder" in n for n in notes)
    with_notes(b, ["trained by: scehr train --config runs/check-x/run/config.json", "other"])
    assert any(d.startswith("manifest notes:") for d in compare_models(a, b)[0])


def test_add_copies_a_built_folder_verified_and_never_overwrites(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    built = write_model(tmp_path / "scratch", "mortality", "v3")
    served = tmp_path / "served"
    write_model(served, "mortality", "v1")
    write_fixture_index(served, [("mortality", "v1")])
    md = ["--model-dir", str(served)]
    assert scehr_cli.main(["models", "add", str(built), *md]) == 0
    out = capsys.readouterr().out
    assert f"-> {served / 'mortality' / 'v3'}" in out and "default mortality stays v1" in out
    assert (served / "mortality" / "v3" / "model.onnx").read_bytes() == \
        (built / "model.onnx").read_bytes()
    assert read_index(served).entry("mortality", "v3") is not None
    # the same version again: refused, nothing changed
    assert scehr_cli.main(["models", "add", str(built), "--set-default", *md]) == 1
    assert "immutable" in capsys.readouterr().err
    assert read_index(served).defaults["mortality"] == "v1"
    # a graph that is not the one the manifest describes is never registered
    bad = write_model(tmp_path / "scratch", "mortality", "v4", corrupt_sha=True)
    assert scehr_cli.main(["models", "add", str(bad), "--set-default", *md]) == 1
    assert "sha256" in capsys.readouterr().err
    assert not (served / "mortality" / "v4").exists()
    assert read_index(served).entry("mortality", "v4") is None
    # asked to, it moves the default and says so
    v5 = write_model(tmp_path / "scratch", "mortality", "v5")
    assert scehr_cli.main(["models", "add", str(v5), "--set-default", *md]) == 0
    assert "default mortality: v1 -> v5" in capsys.readouterr().out


def test_compare_models_says_exactly_what_differs(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    a = write_model(tmp_path / "a", "mortality", "1.0.0", seed=1)
    b = tmp_path / "b"
    shutil.copytree(a, b)
    m = json.loads((b / "manifest.json").read_text())
    m["created_at"] = "2030-01-01T00:00:00+00:00"
    (b / "manifest.json").write_text(json.dumps(m))
    assert compare_models(a, b)[0] == []  # a build stamp alone is a note, not a difference
    m["metrics"]["test_ci"] = {"auroc": {"value": 0.9}}
    (b / "manifest.json").write_text(json.dumps(m))
    (b / "model.onnx").write_bytes((a / "model.onnx").read_bytes() + b"\0")
    diffs, notes = compare_models(a, b)
    assert notes == ['created_at: "' + json.loads((a / "manifest.json").read_text())[
        "created_at"] + '" vs "2030-01-01T00:00:00+00:00"']
    assert diffs[0].startswith("model.onnx: sha256 ")
    assert any(d.startswith("manifest metrics.test_ci.auroc.value:") for d in diffs)
    assert scehr_cli.main(["models", "diff", str(a), str(b)]) == 1
    assert "differs: model.onnx: sha256" in capsys.readouterr().out
    assert scehr_cli.main(["models", "diff", str(a), str(a)]) == 0
