"""benchmarks/classical_baselines.py: both models chosen on validation, scored on test."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from benchmarks import classical_baselines
from scehr.training.data.synthetic import write_synthetic


def test_runs_on_a_converted_dataset_and_writes_predictions(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_synthetic(tmp_path / "synth", task="mortality", n_train=160, n_test=60,
                           prevalence=0.25, seed=3, progress=False)
    out = tmp_path / "out"
    assert classical_baselines.main([str(data), "--n-boot", "20", "--out", str(out)]) == 0
    rows = json.loads((out / "summary.json").read_text())
    assert [r["model"] for r in rows] == ["logistic_regression", "gradient_boosting"]
    assert rows[0]["chosen"] in classical_baselines.C_GRID
    assert all(r["test_auroc"]["value"] > 0.8 for r in rows)  # the synthetic signal is strong
    preds = pd.read_csv(out / "predictions.csv")
    assert set(preds["split"]) == {"val", "test"} and preds["probability"].between(0, 1).all()
    assert "| logistic_regression | benchmark76-48h |" in capsys.readouterr().out


def test_a_dataset_of_another_feature_set_is_a_one_line_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "provenance.json").write_text(json.dumps(
        {"feature_set": {"name": "benchmark76-48h"}}))
    assert classical_baselines.main([str(tmp_path), "--feature-set", "physionet2012-full"]) == 1
    assert "converted with --feature-set benchmark76-48h" in capsys.readouterr().err
