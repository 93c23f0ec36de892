"""The exported model scored by ONNX Runtime (`ExportedModel`, the tiny synthetic
`home_model` of conftest.py); the site model `scehr recalibrate` writes is tested in
test_site_model.py, the evaluation report (`scehr evaluate`) in test_site_report.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from scehr.training.external import ExportedModel


def test_onnx_scoring_reproduces_the_runs_own_test_predictions(home_model: Path) -> None:
    root = home_model.parents[2]
    model = ExportedModel(home_model)
    scored = model.score(model.load(root / "home", "test"))
    with np.load(root / "run" / "predictions.npz") as saved:
        np.testing.assert_allclose(scored.probability, saved["test_probability"][:, 0],
                                   atol=1e-5)
        np.testing.assert_array_equal(scored.y, saved["test_y"][:, 0])
