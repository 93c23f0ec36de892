"""Fixtures shared by the training tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from scehr.schemas.model_index import import_model
from scehr.training.config import TrainConfig
from scehr.training.data.synthetic import write_synthetic
from scehr.training.export import export_run
from scehr.training.run import train_run


@pytest.fixture(scope="session")
def home_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny exported mortality model (`<root>/models/mortality/0.1.0`), trained on a
    synthetic home dataset (`<root>/home`) in the run directory `<root>/run`."""
    root = tmp_path_factory.mktemp("home-model")
    home = write_synthetic(root / "home", "mortality", n_train=300, n_test=100, prevalence=0.3,
                           seed=1)
    cfg = TrainConfig(task="mortality", data=str(home), out=str(root / "run"), encoder="lstm",
                      encoder_hparams={"units": 4, "depth": 1, "bidirectional": False,
                                       "dropout": 0.0, "static": True},
                      loss="cbce", lam=0.01, batch_size=32, epochs=2, seed=0, threads=1,
                      n_boot=20, tsne=False, progress=False)
    train_run(cfg)
    return export_run(root / "run", root / "models" / "mortality" / "0.1.0")[0]


@pytest.fixture(scope="session")
def landmark(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TrainConfig]:
    """`<root>/models` with a tiny mortality-landmark 0.1.0 (causal summary LSTM), and its
    training config (the synthetic data's test split)."""
    root = tmp_path_factory.mktemp("landmark-model")
    data = write_synthetic(root / "data", "mortality", n_train=300, n_test=60,
                           prevalence=0.3, seed=5)
    cfg = TrainConfig(task="mortality-landmark", data=str(data), out=str(root / "run"),
                      encoder="causal_sumlstm", encoder_hparams={"units": 4, "summary_dim": 4},
                      loss="csce", lam=0.007, batch_size=32, epochs=1, seed=0, threads=1,
                      n_boot=10, plots=False, progress=False, calibration_fraction=0.25,
                      landmark={"hours_per_batch": 4})
    train_run(cfg)
    built, _ = export_run(root / "run", root / "build")
    import_model(root / "models", built, set_default=True)
    return root / "models", cfg
