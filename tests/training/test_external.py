"""External validation of an exported model on another dataset (tiny synthetic model and
sites); the site model `scehr recalibrate` writes is tested in test_site_model.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scehr.training.config import TrainConfig
from scehr.training.data.synthetic import write_synthetic
from scehr.training.export import export_run
from scehr.training.external import ExportedModel, evaluate_external
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


def test_external_report_before_and_after_recalibration(setup: tuple) -> None:
    root, _, site = setup
    out = evaluate_external(root / "models" / "mortality" / "0.1.0", site, n_boot=20)
    every, test = out["shipped_all_stays"], out["recalibrated_test"]
    assert every["n"] == 420 and out["shipped_test"]["n"] == test["n"] == 120
    for block in ("shipped_all_stays", "shipped_test", "recalibrated_test"):
        for k in ("auroc", "auprc", "ece", "calibration_slope", "calibration_intercept",
                  "event1", "event2_h_normalized"):
            ci = out[block][k]
            assert ci["value"] is not None and ci["low"] <= ci["high"], (block, k)
            if k in ("auroc", "auprc"):  # ECE, H and Event 1 are biased under resampling:
                # their percentile interval need not hold the point value (20 resamples)
                assert ci["low"] <= ci["value"] <= ci["high"], (block, k)
    # a monotone recalibration of the same scores keeps the ranking
    if out["recalibration"]["method"] == "temperature":
        assert test["auroc"]["value"] == pytest.approx(out["shipped_test"]["auroc"]["value"])
    assert "train split" in out["recalibration"]["fitted_on"]
    assert out["fairness_all_stays"]["groups"]["all"]["n"] == 420
    assert out["fairness_all_stays"]["sex_flip"]["n"] > 0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_evaluating_on_the_training_data_warns_and_another_site_does_not(setup: tuple) -> None:
    """The home dataset (the model's own training data) is flagged; another site is not."""
    root, home, site = setup
    folder = root / "models" / "mortality" / "0.1.0"
    assert evaluate_external(folder, site, n_boot=5)["warnings"] == []
    warnings = evaluate_external(folder, home, n_boot=5)["warnings"]
    assert len(warnings) == 1 and "trained on" in warnings[0] and "not an external" in warnings[0]
