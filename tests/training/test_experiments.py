"""Studies on tiny synthetic data: resumable grid, imbalance sweep, baseline, comparison,
re-evaluation and the embedding report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import scehr.training.studies.experiments as exp
from scehr.training.config import TrainConfig
from scehr.training.data.splits import load_split
from scehr.training.data.synthetic import write_synthetic
from scehr.training.evaluate import evaluate_run
from scehr.training.metrics import auroc
from scehr.training.studies.baseline import (
    baseline_predictions,
    feature_names,
    fit_gbm_baseline,
    fit_logistic_baseline,
)

TINY = {"units": 4, "depth": 1, "bidirectional": False, "dropout": 0.0}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("synth"), "mortality", n_train=150,
                           n_test=60, prevalence=0.25, seed=1)


@pytest.fixture
def cfg(data_dir: Path) -> TrainConfig:
    return TrainConfig(task="mortality", data=str(data_dir), encoder="lstm",
                       encoder_hparams=dict(TINY), loss="cbce", batch_size=32, epochs=1,
                       patience=5, threads=1, n_boot=20, tsne=False, progress=False)


@pytest.fixture(scope="module")
def grid(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    base = TrainConfig(task="mortality", data=str(data_dir), encoder_hparams=dict(TINY),
                       batch_size=32, epochs=1, threads=1, n_boot=20, tsne=False,
                       progress=False)
    gdir = tmp_path_factory.mktemp("grid")
    return gdir, exp.run_grid(base, gdir, batch_sizes=[32], lams=[0.0, 0.01], losses=["cbce"],
                              seeds=[0])


def test_grid_writes_summary_and_selects_on_validation(grid: tuple[Path, dict]) -> None:
    gdir, out = grid
    assert out["data_loads"] == 1  # one prepare() shared by both combos
    assert all(r["trained_now"] for r in out["runs"])
    for name in ("summary.csv", "summary.md", "best.json"):
        assert (gdir / name).is_file()
    best = json.loads((gdir / "best.json").read_text())
    vals = {r["lam"]: r["val_auroc"] for r in out["runs"]}
    assert best["val_auroc"]["mean"] == max(vals.values())
    assert best["lam"] == max(vals, key=lambda k: vals[k])
    assert "validation" in best["selected_on"] and "seed" not in best["config"]


def test_grid_resumes_only_missing_runs(grid: tuple[Path, dict],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    gdir, _ = grid
    base = TrainConfig(**{**json.loads((gdir / "cbce-bs32-lam0-s0/config.json").read_text()),
                          "out": "", "lam": 0.0})
    (gdir / "cbce-bs32-lam0.01-s0" / "metrics.json").unlink()
    kept = (gdir / "cbce-bs32-lam0-s0" / "metrics.json").stat().st_mtime_ns
    trained: list[str] = []
    real = exp.train_run

    def counting(cfg: TrainConfig, data: object = None, **kwargs: object) -> dict:
        trained.append(Path(cfg.out).name)
        return real(cfg, data, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(exp, "train_run", counting)
    out = exp.run_grid(base, gdir, batch_sizes=[32], lams=[0.0, 0.01], losses=["cbce"],
                       seeds=[0])
    assert trained == ["cbce-bs32-lam0.01-s0"]
    assert (gdir / "cbce-bs32-lam0-s0" / "metrics.json").stat().st_mtime_ns == kept
    assert [r["trained_now"] for r in out["runs"]] == [False, True]


def test_resuming_with_other_settings_is_refused(grid: tuple[Path, dict]) -> None:
    run_dir = grid[0] / "cbce-bs32-lam0-s0"
    saved = json.loads((run_dir / "config.json").read_text())
    cfg = TrainConfig(**{**saved, "epochs": 7, "threads": 2})
    with pytest.raises(ValueError, match=r"\['epochs'\]"):
        exp.ensure_run(cfg, exp.DataCache())
    assert exp.ensure_run(TrainConfig(**{**saved, "threads": 2}), exp.DataCache())[1] is False


def test_evaluate_run_matches_saved_metrics(grid: tuple[Path, dict]) -> None:
    run_dir = grid[0] / "cbce-bs32-lam0-s0"
    out = evaluate_run(run_dir, n_boot=30, plots=False)
    assert out["matches_saved"] and out["source"] == "predictions.npz"
    assert out["test_ci"]["auroc"]["n_boot"] == 30
    ch = out["challenge2012"]  # binary task: the Challenge's scores, on the served risk too
    assert 0 <= ch["uncalibrated_probability"]["event1"]["value"] <= 1
    assert ch["risk"]["event2_h_normalized"]["value"] >= 0
    again = evaluate_run(run_dir, n_boot=10, recompute=True, plots=False)
    assert again["max_abs_diff_vs_saved_predictions"] < 1e-6 and again["same_test_stays"]
    assert (run_dir / "evaluation.json").is_file()


def test_embedding_study_reports_metrics(grid: tuple[Path, dict]) -> None:
    run_dir = grid[0] / "cbce-bs32-lam0.01-s0"
    out = exp.embedding_study(run_dir, max_points=60)
    assert {"separation", "intra_class_spread", "linear_probe_auroc"} <= set(out)
    assert (run_dir / "embedding.json").is_file() and (run_dir / "embedding_tsne.png").is_file()
    with pytest.raises(ValueError, match="out of range"):  # a clean CLI error, not IndexError
        exp.embedding_study(run_dir, label=1)


def test_baseline_beats_chance(data_dir: Path) -> None:
    tr, va, te = (load_split(data_dir, "mortality", s) for s in ("train", "val", "test"))
    model = fit_logistic_baseline(tr, va)
    assert model.features(te).shape == (len(te), len(feature_names(model.fs)))
    pred = baseline_predictions(model, te)
    assert pred["probability"].shape == (len(te), 1)
    assert auroc(pred["y"], pred["probability"]) > 0.75
    assert model.C in model.val_scores
    gbm = fit_gbm_baseline(tr, va, grid=[{"learning_rate": 0.1, "max_leaf_nodes": 7},
                                         {"learning_rate": 0.03, "max_leaf_nodes": 7}])
    scores = gbm.val_scores
    assert gbm.summary()["model"] == "gradient_boosting" and len(scores) == 2
    assert scores[gbm.C] == max(scores.values())  # chosen on validation
    assert auroc(pred["y"], baseline_predictions(gbm, te)["probability"]) > 0.7


def test_baseline_features_use_only_observed_bins() -> None:
    from scehr.schemas.featureset import BENCHMARK_48H as fs
    from scehr.training.studies.baseline import summary_features

    x = np.zeros((1, 4, fs.n_features), np.float32)
    hr = [v.id for v in fs.variables].index("heart_rate")
    col, mask = int(fs.begins[hr]), fs.n_value_columns + hr
    x[0, :, col] = [80, 80, 100, 100]  # forward-filled: observed at bins 0 and 2 only
    x[0, [0, 2], mask] = 1
    f = summary_features(x, np.array([4]), fs)[0]
    names = feature_names(fs)
    got = {s: f[names.index(f"heart_rate:{s}")]
           for s in ("first", "last", "min", "max", "mean", "delta", "slope", "count")}
    assert got == {"first": 80, "last": 100, "min": 80, "max": 100, "mean": 90, "delta": 20,
                   "slope": 10, "count": 2}  # +20 bpm over 2 hours
    x[0, 3, mask] = 1  # a third observation (100 at bin 3): least squares through 3 points
    f = summary_features(x, np.array([4]), fs)[0]
    assert f[names.index("heart_rate:slope")] == pytest.approx(np.polyfit([0, 2, 3],
                                                                          [80, 100, 100], 1)[0])
    assert np.isnan(f[names.index("ph:slope")])
    assert np.isnan(f[names.index("ph:mean")]) and f[names.index("ph:count")] == 0


def test_baseline_scores_ordinal_gcs_and_sums_urine() -> None:
    from scehr.schemas.featureset import FEATURE_SETS
    from scehr.training.studies.baseline import summary_features

    fs = FEATURE_SETS["physionet2012-full"]
    ids = [v.id for v in fs.variables]
    x = np.zeros((1, 4, fs.n_features), np.float32)
    gcs, urine = ids.index("gcs_total"), ids.index("urine_output")
    cats = fs.variables[gcs].categories
    for step, score in ((0, "15"), (1, "15"), (2, "7"), (3, "7")):  # carried forward at 1, 3
        x[0, step, int(fs.begins[gcs]) + cats.index(score)] = 1
    x[0, [0, 2], fs.n_value_columns + gcs] = 1
    x[0, :, int(fs.begins[urine])] = [50, 50, 0, 120]
    x[0, [0, 2, 3], fs.n_value_columns + urine] = 1  # 0 mL at bin 2 is an observation
    f = summary_features(x, np.array([4]), fs)[0]
    names = feature_names(fs)
    assert len(names) == len(f) + 4  # the static fields follow
    got = {s: f[names.index(f"gcs_total:score:{s}")] for s in ("first", "last", "min", "mean")}
    assert got == {"first": 15, "last": 7, "min": 7, "mean": 11}
    assert f[names.index("urine_output:sum")] == 170 and "weight:sum" not in names


def test_imbalance_study_writes_table_and_plot(cfg: TrainConfig, tmp_path: Path) -> None:
    out = exp.run_imbalance(cfg, tmp_path, prevalences=[0.1], seeds=[0], losses=["bce@0.01"])
    row = out["runs"][0]
    assert row["model"] == "bce+SCR(λ=0.01)" and row["train_prevalence"] < 0.2
    assert (tmp_path / "imbalance.png").is_file() and (tmp_path / "imbalance.csv").is_file()
    assert "test AUROC" in (tmp_path / "imbalance.md").read_text()


def test_comparison_writes_paired_differences(cfg: TrainConfig, tmp_path: Path) -> None:
    docs = tmp_path / "docs" / "cmp.md"
    r = exp.run_comparison(cfg, tmp_path / "study", lam=0.01, seeds=[0], docs=docs)
    seed = r["per_seed"][0]
    assert len(seed["models"]) == 3 and len(seed["paired_diffs"]) == 2
    for diffs in seed["paired_diffs"].values():
        for metric in ("auroc", "auprc"):
            assert {"diff", "low", "high", "p_value", "n_valid"} <= set(diffs[metric])
    for m in seed["models"].values():
        assert m["wall_seconds"] > 0 and m["test_ci"]["auroc"]["low"] is not None
    text = docs.read_text()
    assert "paired difference" in text and "scehr compare" in text and "cmp_roc.png" in text
    assert (docs.parent / "cmp_roc.png").is_file() and (docs.parent / "cmp_pr.png").is_file()
    assert (tmp_path / "study" / "comparison.json").is_file()
