"""External validation of an exported model on another dataset (tiny synthetic model and
sites); the site model `scehr recalibrate` writes is tested in test_site_model.py, the
evaluation report (`scehr evaluate`) in test_site_report.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scehr.training.config import TrainConfig
from scehr.training.data.synthetic import write_synthetic
from scehr.training.export import export_run
from scehr.training.external import ExportedModel
from scehr.training.run import train_run

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("external")
    home = write_synthetic(root / "home", "mortality", n_train=300, n_test=100, prevalence=0.3,
                           seed=1)
    site = write_synthetic(root / "site", "mortality", n_train=300, n_test=120, prevalence=0.15,
                           seed=7)
    cfg = TrainConfig(task="mortality", data=str(home), out=str(root / "run"), encoder="lstm",
                      encoder_hparams={"units": 4, "depth": 1, "bidirectional": False,
                                       "dropout": 0.0, "static": True},
                      loss="cbce", lam=0.01, batch_size=32, epochs=2, seed=0, threads=1,
                      n_boot=20, tsne=False, progress=False)
    train_run(cfg)
    export_run(root / "run", root / "models" / "mortality" / "0.1.0")
    return root, home, site


def test_onnx_scoring_reproduces_the_runs_own_test_predictions(setup: tuple) -> None:
    root, home, _ = setup
    model = ExportedModel(root / "models" / "mortality" / "0.1.0")
    scored = model.score(model.load(home, "test"))
    with np.load(root / "run" / "predictions.npz") as saved:
        np.testing.assert_allclose(scored.probability, saved["test_probability"][:, 0],
                                   atol=1e-5)
        np.testing.assert_array_equal(scored.y, saved["test_y"][:, 0])


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
