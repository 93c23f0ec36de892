"""End-to-end training on tiny synthetic data: run directory, reproducibility, early stopping,
checkpoint round trip, and configuration precedence."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from scehr.training.config import TrainConfig, load_config
from scehr.training.data.synthetic import write_synthetic
from scehr.training.fit import load_checkpoint, predict, prepare
from scehr.training.run import train_run

REPO = Path(__file__).resolve().parents[2]
TINY = {"units": 4, "depth": 2, "bidirectional": True, "dropout": 0.1}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("synth"), "mortality", n_train=150,
                           n_test=60, prevalence=0.25, seed=0)


def tiny_cfg(data: Path, out: Path, **kw: object) -> TrainConfig:
    base = dict(task="mortality", data=str(data), out=str(out), encoder="lstm",
                encoder_hparams=dict(TINY), loss="cbce", lam=0.01, batch_size=32, epochs=2,
                patience=5, seed=3, threads=1, n_boot=20, tsne=False, progress=False)
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("run") / "r"
    return out, train_run(tiny_cfg(data_dir, out, tsne=True))


def test_train_run_writes_the_run_directory(run: tuple[Path, dict]) -> None:
    out, final = run
    for name in ("config.json", "epochs.csv", "metrics.json", "predictions.npz", "model.pt",
                 "roc.png", "pr.png", "calibration.png", "learning_curves.png", "tsne.png"):
        assert (out / name).is_file(), name
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["test"]["auroc"] == pytest.approx(final["test"]["auroc"])
    assert set(saved["test_ci"]) == {"auroc", "auprc"}
    with open(out / "epochs.csv") as f:
        assert len(list(csv.DictReader(f))) == saved["epochs_run"] == 2
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["encoder_hparams"] == TINY and cfg["out"] == str(out)


def test_same_seed_reproduces_the_run(run: tuple[Path, dict], data_dir: Path,
                                      tmp_path: Path) -> None:
    out, final = run
    again = train_run(tiny_cfg(data_dir, tmp_path / "again", tsne=True))
    assert again["val"]["auroc"] == final["val"]["auroc"]
    with np.load(out / "predictions.npz") as a, np.load(tmp_path / "again/predictions.npz") as b:
        np.testing.assert_array_equal(a["test_probability"], b["test_probability"])


def test_checkpoint_reproduces_predictions(run: tuple[Path, dict]) -> None:
    out, _ = run
    model, crit, ck = load_checkpoint(out / "model.pt")
    cfg = TrainConfig(**ck["config"])
    test = predict(model, crit, prepare(cfg).test)
    with np.load(out / "predictions.npz") as saved:
        np.testing.assert_allclose(test["probability"], saved["test_probability"], atol=1e-6)
        np.testing.assert_allclose(test["z"], saved["test_z"], atol=1e-6)


def test_early_stopping_stops_after_patience(data_dir: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import scehr.training.fit as fit_mod

    scores = iter([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])  # validation only gets worse after epoch 1
    real = fit_mod.task_metrics

    def worsening(task: str, y: np.ndarray, p: np.ndarray, *a: object) -> dict:
        return {**real(task, y, p, *a), "auroc": next(scores)}

    monkeypatch.setattr(fit_mod, "task_metrics", worsening)
    cfg = tiny_cfg(data_dir, tmp_path / "es", epochs=6, patience=2)
    res = fit_mod.fit(cfg, prepare(cfg))
    assert res.best_epoch == 1 and len(res.history) == 1 + cfg.patience
    assert res.best_val == pytest.approx(0.9)


def test_toml_then_overrides(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text('task = "mortality"\nlam = 0.005\nbatch_size = 64\n'
                 '[encoder_hparams]\nunits = 8\ndepth = 1\n')
    cfg = load_config(p, batch_size=16, lam=None, seed=7)
    assert (cfg.lam, cfg.batch_size, cfg.seed) == (0.005, 16, 7)  # None leaves the file's value
    assert cfg.encoder_hparams == {"units": 8, "depth": 1}
    assert cfg.lr == TrainConfig().lr  # untouched keys keep their defaults


def test_unknown_config_key_is_named(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text("learning_rate = 0.1\n")
    with pytest.raises(ValueError, match="learning_rate"):
        load_config(p)
    with pytest.raises(ValueError, match="bogus"):
        load_config(None, bogus=1)


def test_shipped_configs_load() -> None:
    paper = load_config(REPO / "configs/paper_mortality.toml")
    assert (paper.task, paper.loss, paper.lam, paper.batch_size) == ("mortality", "cbce",
                                                                      0.007, 256)
    assert paper.encoder_hparams == {"units": 16, "depth": 2, "bidirectional": True,
                                     "dropout": 0.3}
    assert (paper.lr, paper.patience, paper.epochs) == (1e-3, 10, 100)
    phen = load_config(REPO / "configs/phenotypes_eicu.toml")
    assert phen.task == "phenotypes" and phen.encoder_hparams["units"] == 64


def test_encoder_params_override_the_file_or_the_preset(tmp_path: Path) -> None:
    from scehr.training.config import parse_param

    assert parse_param("units=32") == ("units", 32)
    assert parse_param("static=true") == ("static", True)
    assert parse_param("name=abc") == ("name", "abc")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_param("units")
    cfg = load_config(None, encoder_params={"units": 32}, task="mortality")
    assert cfg.encoder_hparams == {"units": 32, "depth": 2, "bidirectional": True,
                                   "dropout": 0.3}
    path = tmp_path / "c.toml"
    path.write_text('task = "phenotypes"\n[encoder_hparams]\nunits = 64\ndepth = 1\n')
    cfg = load_config(path, encoder_params={"static": True})
    assert cfg.encoder_hparams == {"units": 64, "depth": 1, "static": True}


@pytest.mark.parametrize("case", ["empty", "one_class"])
def test_unusable_validation_split_is_a_clear_error(data_dir: Path, tmp_path: Path,
                                                    case: str) -> None:
    """An empty split, or validation labels all equal (nothing to select on), fail up front."""
    import shutil

    import pandas as pd

    data = tmp_path / "data"
    shutil.copytree(data_dir, data, ignore=shutil.ignore_patterns(".scehr-cache"))
    val = data / "in-hospital-mortality" / "val_listfile.csv"
    table = pd.read_csv(val)
    table = table.iloc[:0] if case == "empty" else table[table["y_true"] == 0]
    table.to_csv(val, index=False)
    match = "val split of mortality is empty" if case == "empty" else "no epoch can be selected"
    with pytest.raises(ValueError, match=match):
        prepare(tiny_cfg(data, tmp_path / "r"))


def test_too_few_training_stays_for_a_calibration_split(data_dir: Path, tmp_path: Path) -> None:
    data = prepare(tiny_cfg(data_dir, tmp_path / "r", max_train_stays=4))
    assert data.calib is None and len(data.train) == 4
