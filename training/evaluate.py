"""Re-evaluate a finished run directory: test metrics, bootstrap CIs and plots, from its files.

Reads `predictions.npz` (written by training.run.train_run), so a run can be re-scored with more
bootstrap replicates without touching data or model. With `recompute=True`, or when the
predictions file is missing, the checkpoint is reloaded and the splits re-read from the data
folder named in its config, which also checks that `model.pt` reproduces the saved predictions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from scehr.schemas.run_artifacts import RunArtifacts, split_key
from scehr.schemas.tasks import task_spec
from scehr.training.bootstrap import bootstrap_metrics
from scehr.training.config import TrainConfig
from scehr.training.metrics import task_metrics
from scehr.training.plots import plot_pr_curves, plot_reliability, plot_roc_curves


def load_run_config(run_dir: Path) -> TrainConfig:
    files = RunArtifacts(run_dir)
    files.require(files.config)
    return TrainConfig(**json.loads(files.config.read_text()))


def load_predictions(run_dir: Path) -> dict[str, dict[str, np.ndarray]]:
    """{"val": {...}, "test": {...}, ...}: y, probability, anchor_logits, z, stays per split."""
    with np.load(RunArtifacts(run_dir).predictions) as f:
        out: dict[str, dict[str, np.ndarray]] = {}
        for key in f.files:
            split, name = split_key(key)
            out.setdefault(split, {})[name] = f[key]
    return out


def predictions_from_checkpoint(run_dir: Path, cfg: TrainConfig) -> dict[str, dict[str, Any]]:
    """Re-predict val and test with `model.pt` on the splits the run was trained with."""
    from scehr.training.fit import load_checkpoint, predict, prepare

    model, crit, _ = load_checkpoint(RunArtifacts(run_dir).checkpoint)
    data = prepare(cfg)
    out: dict[str, dict[str, Any]] = {}
    for split in ("val", "test"):
        ts = getattr(data, split)
        out[split] = {**predict(model, crit, ts), "stays": np.array(ts.stays)}
    return out


def _label_names(run_dir: Path, saved: dict[str, Any]) -> list[str] | None:
    per_label = saved.get("test", {}).get("per_label_auroc")
    if per_label:
        return list(per_label)
    if (run_dir / "model.pt").is_file():
        import torch

        return list(torch.load(run_dir / "model.pt", map_location="cpu",
                               weights_only=False)["label_names"])
    return None


def evaluate_run(
    run_dir: Path, n_boot: int = 1000, recompute: bool = False, plots: bool = True,
    seed: int | None = None,
) -> dict[str, Any]:
    """Test (and val) metrics, test CIs with `n_boot` replicates; writes `evaluation.json`."""
    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir)
    saved_path = run_dir / "metrics.json"
    saved = json.loads(saved_path.read_text()) if saved_path.is_file() else {}
    have_npz = (run_dir / "predictions.npz").is_file()
    source = "checkpoint" if recompute or not have_npz else "predictions.npz"
    preds = predictions_from_checkpoint(run_dir, cfg) if source == "checkpoint" \
        else load_predictions(run_dir)
    names = _label_names(run_dir, saved)
    test, val = preds["test"], preds["val"]
    out: dict[str, Any] = {
        "run_dir": str(run_dir),
        "task": cfg.task,
        "source": source,
        "val": task_metrics(cfg.task, val["y"], val["probability"], names),
        "test": task_metrics(cfg.task, test["y"], test["probability"], names),
        "test_ci": bootstrap_metrics(cfg.task, test["y"], test["probability"], n_boot=n_boot,
                                     seed=cfg.seed if seed is None else seed),
    }
    if source == "checkpoint" and have_npz:
        old = load_predictions(run_dir)["test"]
        out["max_abs_diff_vs_saved_predictions"] = float(
            np.max(np.abs(old["probability"] - test["probability"])))
        out["same_test_stays"] = bool(np.array_equal(old["stays"], test["stays"]))
    if test["y"].ndim == 1 or test["y"].shape[1] == 1:
        out["challenge2012"] = challenge2012_scores(cfg, preds, n_boot,
                                                    cfg.seed if seed is None else seed)
    headline = out["test"]["headline"]
    if saved:
        out["saved_test_headline"] = saved["test"][headline]
        new, old_v = out["test"][headline], saved["test"][headline]
        out["matches_saved"] = (new is None and old_v is None) or (
            new is not None and old_v is not None and abs(new - old_v) < 1e-9)
    if plots:
        _plots(run_dir, cfg, test, out["test_ci"])
    from scehr.training.data.writer import write_json

    write_json(run_dir / "evaluation.json", out)
    return out


def served_risk(cfg: TrainConfig, preds: dict[str, dict[str, np.ndarray]]
                ) -> dict[str, np.ndarray] | None:
    """Class 0's risk the service would show on each split of a run ("method": the map), with
    the calibration map fitted exactly as `scehr export` fits it (calibration split, chosen on
    validation); None when the run has no calibration split."""
    from scehr.training.losses import calibration_input
    from scehr.training.serving_assets import fit_calibration

    def column(split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        d = preds[split]
        lg = d["anchor_logits"].reshape(len(d["y"]), -1, 2)[:, 0]
        return d["y"].reshape(-1), d["probability"].reshape(-1), lg[:, 0] - lg[:, 1]

    if "calib" not in preds or not len(preds["calib"]["y"]):
        return None
    calib = fit_calibration(column("calib"), column("val"), "calibration split",
                            calibration_input(cfg.loss))
    out: dict[str, Any] = {"method": calib.method}
    for split in ("val", "test"):
        _, p, m = column(split)
        out[split] = calib.apply(p, m)
    return out


def challenge2012_scores(cfg: TrainConfig, preds: dict[str, dict[str, np.ndarray]], n_boot: int,
                         seed: int) -> dict[str, Any]:
    """Challenge 2012 Event 1/2 of a binary run, on the calibrated risk the service would show
    (`served_risk`); the model's uncalibrated probability is scored too, labelled as such."""
    from scehr.training.challenge2012 import challenge_scores

    yv, yt = preds["val"]["y"].reshape(-1), preds["test"]["y"].reshape(-1)
    out: dict[str, Any] = {"uncalibrated_probability": challenge_scores(
        yv, preds["val"]["probability"].reshape(-1), yt,
        preds["test"]["probability"].reshape(-1), n_boot=n_boot, seed=seed)}
    risk = served_risk(cfg, preds)
    if risk is not None:
        out["calibration"] = risk["method"]
        out["risk"] = challenge_scores(yv, risk["val"], yt, risk["test"], n_boot=n_boot,
                                       seed=seed)
    return out


def _plots(run_dir: Path, cfg: TrainConfig, test: dict[str, np.ndarray],
           ci: dict[str, Any]) -> None:
    name = f"{cfg.encoder}+{cfg.loss}" + (f"+SCR(λ={cfg.lam:g})" if cfg.lam else "")
    models = {name: (test["y"], test["probability"])}
    roc_key = task_spec(cfg.task).headline_metric
    plot_roc_curves(run_dir / "roc.png", models, cis={name: ci[roc_key]},
                    title=f"{cfg.task}: test ROC")
    plot_pr_curves(run_dir / "pr.png", models, cis={name: ci["auprc"]} if "auprc" in ci
                   else None, title=f"{cfg.task}: test precision-recall")
    plot_reliability(run_dir / "calibration.png", models, title=f"{cfg.task}: reliability")
