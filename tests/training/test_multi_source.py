"""Multi-source training: several datasets' train and val splits train one model; the test
split is the first dataset's, and the others' test splits stay out for external validation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scehr.schemas.manifest import load_manifest
from scehr.training.config import TrainConfig
from scehr.training.data.splits import concat_splits, load_split
from scehr.training.data.synthetic import write_synthetic
from scehr.training.export import export_run
from scehr.training.fit import prepare
from scehr.training.run import train_run
from scehr.training.site_report import evaluate_external


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("multi")
    home = write_synthetic(root / "home", "mortality", n_train=200, n_test=80, prevalence=0.3,
                           seed=1)
    site = write_synthetic(root / "site", "mortality", n_train=150, n_test=60, prevalence=0.2,
                           seed=5)
    return root, home, site


def cfg(home: Path, site: Path, out: Path) -> TrainConfig:
    return TrainConfig(task="mortality", data=str(home), extra_data=[str(site)], out=str(out),
                       encoder="lstm", encoder_hparams={"units": 4, "depth": 1,
                                                        "bidirectional": False,
                                                        "dropout": 0.0},
                       loss="bce", batch_size=32, epochs=1, seed=0, threads=1, n_boot=5,
                       plots=False, tsne=False, progress=False)


def test_train_and_val_join_while_test_stays_the_first_datasets(sites: tuple) -> None:
    root, home, site = sites
    data = prepare(cfg(home, site, root / "unused"))
    fs = data.raw["train"].feature_set
    n = {s: {d: len(load_split(d, "mortality", s, fs)) for d in (home, site)}
         for s in ("train", "val", "test")}
    assert len(data.train) + len(data.calib or []) == n["train"][home] + n["train"][site]
    assert len(data.val) == n["val"][home] + n["val"][site]
    assert len(data.test) == n["test"][home]
    names = data.raw["val"].stays
    assert sum(s.startswith("site/") for s in names) == n["val"][site]
    assert len(set(names)) == len(names)


def test_splits_of_different_feature_sets_are_refused(sites: tuple) -> None:
    from scehr.schemas.featureset import FEATURE_SETS

    _, home, _ = sites
    a = load_split(home, "mortality", "test", FEATURE_SETS["benchmark76-48h"])
    b = load_split(home, "mortality", "test", FEATURE_SETS["physionet2012-full"])
    with pytest.raises(ValueError, match="differ in task or feature set"):
        concat_splits([a, b], ["a", "b"])
    joined = concat_splits([a, a], ["x", "y"])
    np.testing.assert_array_equal(joined.x[: len(a)], a.x)
    assert joined.y.sum() == 2 * a.y.sum()


def test_the_export_names_every_source_and_evaluation_warns_on_a_training_site(
        sites: tuple) -> None:
    root, home, site = sites
    train_run(cfg(home, site, root / "run"))
    assert json.loads((root / "run" / "config.json").read_text())["extra_data"] == [str(site)]
    out = root / "models" / "mortality" / "0.1.0"
    export_run(root / "run", out)
    manifest = load_manifest(out / "manifest.json")
    assert manifest.provenance.dataset.count(" + ") == 1
    assert any(n.startswith("multi-source training") for n in manifest.notes)
    report = evaluate_external(out, site, n_boot=5)
    assert any("was trained on" in w and "only its test split" in w
               for w in report["warnings"])
    test = evaluate_external(out, site, split="test", n_boot=5)
    assert test["data"]["stays"] == len(load_split(site, "mortality", "test"))
