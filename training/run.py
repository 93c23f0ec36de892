"""One training run end to end, written to a run directory.

`<run>/config.json` (resolved), `epochs.csv`, `model.pt`, `predictions.npz` (validation and
test: y, probability, anchor logits, z), `metrics.json` (test metrics with bootstrap CIs) and
PNG plots (ROC, PR, calibration, learning curves, t-SNE with the anchors).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from scehr.schemas.run_artifacts import RunArtifacts, prediction_key
from scehr.schemas.tasks import task_spec
from scehr.training.bootstrap import bootstrap_ci, bootstrap_metrics
from scehr.training.config import TrainConfig
from scehr.training.data.writer import write_json
from scehr.training.distributed import current_world, init_from_env
from scehr.training.evaluate import reliability_models
from scehr.training.fit import (
    RESUME_FILE,
    FitResult,
    Prepared,
    fit,
    load_resume,
    predict,
    prepare,
    save_checkpoint,
)
from scehr.training.interrupt import StopRequest, TrainingInterrupted
from scehr.training.metrics import (
    balanced_accuracy,
    balanced_accuracy_threshold,
    min_se_ppv,
    task_metrics,
)
from scehr.training.plots import (
    plot_embedding_tsne,
    plot_learning_curves,
    plot_pr_curves,
    plot_reliability,
    plot_roc_curves,
)
from scehr.training.progress import RunLog


def default_run_dir(cfg: TrainConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{cfg.task}-{cfg.encoder}-{cfg.loss}-lam{cfg.lam:g}-s{cfg.seed}-{stamp}"


def train_run(cfg: TrainConfig, data: Prepared | None = None, *, resume: bool = False,
              echo: bool = True) -> dict[str, Any]:
    """Train, select on validation, evaluate on test; returns the final metrics dict.

    `resume`: continue the run in `cfg.out` from its `resume.pt` (written when SIGINT/SIGTERM
    stopped it). `echo=False` keeps per-epoch lines out of stdout (they still go to
    `<run>/train.log`).

    Launched by torchrun (training/distributed.py), every process trains on its share of
    each global batch of `cfg.batch_size` stays; rank 0 alone writes the run directory
    (a named `cfg.out` is then needed: the processes must agree on it) and the others return
    an empty dict once training ends.
    """
    world = init_from_env()
    if world.active and not cfg.out:
        raise ValueError("out: training on several processes needs a run directory (--out), "
                         "the one folder every process reads and rank 0 writes")
    if world.active and cfg.batch_size < world.size:
        raise ValueError(f"batch_size ({cfg.batch_size}) must be at least the number of "
                         f"processes ({world.size}): it is the global batch they share")
    run_dir = Path(cfg.out) if cfg.out else default_run_dir(cfg)
    if world.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    files = RunArtifacts(run_dir)
    cfg.out = str(run_dir)
    state = load_resume(run_dir) if resume else None
    if not resume and world.is_main:
        write_json(files.config, cfg.to_dict())
        (run_dir / "train.log").unlink(missing_ok=True)
    t0 = time.perf_counter()
    data = data if data is not None else prepare(cfg)
    res = fit(cfg, data, run_dir if world.is_main else None, resume=state,
              echo=echo and world.is_main)
    if not world.is_main:
        return {}
    res.model.cpu()  # trained on this process's GPU, if any: evaluated and saved on the CPU
    res.criterion.cpu()
    # A signal during the steps below (a minute at most) stops the process once they are done:
    # the run is then complete, and nothing needs resuming.
    with StopRequest() as stop:
        log = RunLog(run_dir, bar=False, echo=echo)
        save_checkpoint(files.checkpoint, cfg, res, data)
        splits = ("val", "test", "calib") if data.calib is not None else ("val", "test")
        log.announce(f"predicting {' and '.join(splits)} and {len(data.train)} training stays")
        preds = {s: predict(res.model, res.criterion, getattr(data, s)) for s in splits}
        train = predict(res.model, res.criterion, data.train)  # for prototypes at export
        np.savez_compressed(
            files.predictions,
            **{prediction_key(s, k): v for s, p in preds.items() for k, v in p.items()},
            train_z=train["z"], train_y=train["y"],
            test_static_raw=data.raw["test"].static_raw,
            test_stays=np.array(data.test.stays), val_stays=np.array(data.val.stays),
        )
        log.announce(f"test bootstrap: {cfg.n_boot} resamples of {len(data.test)} stays")
        final = summarize(cfg, res, data, preds, time.perf_counter() - t0)
        write_json(files.metrics, final)
        if cfg.plots:
            log.announce("plots: ROC, PR, reliability, learning curves (--no-plots skips them)"
                         + (f", t-SNE of {len(data.test)} test embeddings (--no-tsne skips it)"
                            if cfg.tsne and task_spec(cfg.task).binary else ""))
            make_plots(run_dir, cfg, res, preds, data)
        (run_dir / RESUME_FILE).unlink(missing_ok=True)
        log.line(f"done: best epoch {res.best_epoch}, {time.perf_counter() - t0:.0f} s in all "
                 "(training, evaluation" + (", plots)" if cfg.plots else ")"))
    if stop.requested:
        raise TrainingInterrupted(None, "the run finished (evaluation included): nothing to "
                                  f"resume in {run_dir}", stop.signum or 2)
    return final


def binary_extras(val: dict[str, np.ndarray], test: dict[str, np.ndarray], n_boot: int,
                  seed: int) -> dict[str, Any]:
    """Test min(Se, P+) and balanced accuracy with 95% bootstrap CIs (binary tasks).

    Balanced accuracy needs a threshold: the one maximising it on validation, applied
    unchanged to test (outputs of different losses are not calibrated alike, so a fixed 0.5
    would compare thresholds, not models).
    """
    t = balanced_accuracy_threshold(val["y"][:, 0], val["probability"][:, 0])
    y, p = test["y"][:, 0], test["probability"][:, 0]
    return {
        "min_se_ppv": bootstrap_ci(min_se_ppv, y, p, n_boot=n_boot, seed=seed),
        "balanced_accuracy": bootstrap_ci(lambda a, b: balanced_accuracy(a, b, t), y, p,
                                          n_boot=n_boot, seed=seed),
        "balanced_accuracy_threshold": t,
    }


def summarize(cfg: TrainConfig, res: FitResult, data: Prepared,
              preds: dict[str, dict[str, np.ndarray]], wall: float) -> dict[str, Any]:
    test = preds["test"]
    y, p = test["y"], test["probability"]
    return {
        "run_dir": cfg.out,
        "task": cfg.task,
        "encoder": cfg.encoder,
        "loss": cfg.loss,
        "lam": cfg.lam,
        "batch_size": cfg.batch_size,
        "world_size": current_world().size,
        "seed": cfg.seed,
        "best_epoch": res.best_epoch,
        "epochs_run": len(res.history),
        "val": task_metrics(cfg.task, preds["val"]["y"], preds["val"]["probability"],
                            data.label_names),
        "test": task_metrics(cfg.task, y, p, data.label_names),
        "test_ci": bootstrap_metrics(cfg.task, y, p, n_boot=cfg.n_boot, seed=cfg.seed),
        "test_ci_binary": binary_extras(preds["val"], test, cfg.n_boot, cfg.seed)
        if task_spec(cfg.task).binary else None,
        "regime": cfg.regime,
        "pretrain_epochs": len(res.pretrain_history),
        "n": {s: len(getattr(data, s)) for s in ("train", "val", "test")},
        "train_prevalence": data.train.y.numpy().mean(axis=0).tolist(),
        "train_seconds": res.train_seconds,
        "train_stays_per_second": res.stays_per_second,
        "wall_seconds": wall,
    }


def make_plots(run_dir: Path, cfg: TrainConfig, res: FitResult,
               preds: dict[str, dict[str, np.ndarray]], data: Prepared) -> None:
    test = preds["test"]
    name = f"{cfg.encoder}+{cfg.loss}" + (f"+SCR(λ={cfg.lam:g})" if cfg.lam else "")
    models = {name: (test["y"], test["probability"])}
    plot_roc_curves(run_dir / "roc.png", models, title=f"{cfg.task}: test ROC")
    plot_pr_curves(run_dir / "pr.png", models, title=f"{cfg.task}: test precision-recall")
    plot_reliability(run_dir / "calibration.png", reliability_models(cfg, preds, name),
                     title=f"{cfg.task}: reliability of the test split")
    plot_learning_curves(run_dir / "learning_curves.png", res.history,
                         best_epoch=res.best_epoch, title=f"{cfg.task}: learning curves")
    if cfg.tsne and task_spec(cfg.task).binary:
        u, v = res.model.head.anchors()
        plot_embedding_tsne(run_dir / "tsne.png", test["z"], test["y"][:, 0],
                            anchors={"u (positive)": u[0].numpy(), "v (negative)": v[0].numpy()},
                            class_names={0: "survived", 1: "died"},
                            title="test embeddings with the learned anchors")
