"""Study figures: the per-method embedding study and the AUROC-vs-training-prevalence plot."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scehr.training.data.synthetic import write_synthetic
from scehr.training.evaluate import load_predictions
from scehr.training.studies.embedding_quality import embedding_quality
from scehr.training.studies.study import run_study
from scehr.training.studies.study_report import plot_by_prevalence

STUDY = """seeds = [0, 1]
reference = "bce_p20"
n_boot = 20
[overrides]
task = "mortality"
epochs = 1
batch_size = 16
threads = 1
n_boot = 5
plots = false
encoder_hparams = {units = 4, depth = 1, bidirectional = false, dropout = 0.0}
[methods.bce_p20]
loss = "bce"
lam = 0.0
series = "bce"
train_prevalence = 0.2
[methods.bce_p10]
loss = "bce"
lam = 0.0
series = "bce"
train_prevalence = 0.1
[methods.cbce_p10]
loss = "cbce"
lam = 0.01
series = "cbce_scr"
train_prevalence = 0.1
"""


@pytest.mark.slow
def test_study_embeddings_and_prevalence_plot(tmp_path: Path) -> None:
    data = write_synthetic(tmp_path / "synth", "mortality", n_train=80, n_test=40,
                           prevalence=0.3, seed=0)
    study = tmp_path / "s.toml"
    study.write_text(STUDY)
    out = tmp_path / "out"
    summary = run_study(study, out=out, data=str(data), echo=lambda _: None, embeddings=True)
    assert summary is not None
    assert (out / "by_prevalence.png").stat().st_size > 0
    assert (out / "embeddings_tsne.png").stat().st_size > 0
    report = json.loads((out / "embeddings.json").read_text())
    assert set(report["methods"]) == {"bce_p20", "bce_p10", "cbce_p10"}
    # the per-method value is the mean over seeds of each run's own embedding quality
    row = report["methods"]["cbce_p10"]
    probes = []
    for run_dir in summary["methods"]["cbce_p10"]["run_dirs"]:
        p = load_predictions(Path(run_dir))
        q = embedding_quality(p["train"]["z"], p["train"]["y"][:, 0], p["test"]["z"],
                              p["test"]["y"][:, 0])
        probes.append(q["linear_probe_auroc"])
    assert row["linear_probe_auroc"]["mean"] == pytest.approx(np.mean(probes))
    assert row["linear_probe_auroc"]["n"] == 2
    assert 0.0 <= row["separation"]["mean"] <= 2.0
    assert "| cbce_p10 |" in (out / "embeddings.md").read_text()


def test_prevalence_plot_needs_train_prevalence(tmp_path: Path) -> None:
    ci = {"value": 0.7, "low": 0.6, "high": 0.8}
    summary = {"title": "t", "methods": {
        "a": {"spec": {"loss": "bce"}, "series": "a", "test": {"auroc": ci}}}}
    assert plot_by_prevalence(summary, tmp_path / "p.png") is None
    summary["methods"]["b"] = {"spec": {"train_prevalence": 0.01}, "series": "b",
                               "test": {"auroc": ci}}
    assert plot_by_prevalence(summary, tmp_path / "p.png") == tmp_path / "p.png"
    assert (tmp_path / "p.png").stat().st_size > 0
