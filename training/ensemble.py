"""Ensembles of trained runs, written as one run directory that exports to one ONNX graph.

The ensemble's anchor logits are the mean of its members' (`ensemble_head`), its probability
the loss's own read-out of that mean, its z the members' embeddings side by side: an ordinary
anchor model, so `scehr export`, the service and the explanations take it unchanged (why the
mean and not per-member read-outs: docs/method.md). Members must share everything the served
pipeline or the calibration map depends on: data, data split, normalizer, loss read-out.
Members are chosen on validation only (`greedy_select`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scehr.schemas.run_artifacts import RunArtifacts, prediction_key
from scehr.schemas.tasks import task_spec
from scehr.training.bootstrap import bootstrap_metrics
from scehr.training.config import TrainConfig
from scehr.training.data.writer import write_json
from scehr.training.encoders import build_encoder
from scehr.training.fit import AnchorModel, load_checkpoint, predict, prepare
from scehr.training.heads import AnchorHead
from scehr.training.losses import CombinedLoss
from scehr.training.metrics import task_metrics
from scehr.training.run import binary_extras

#: Config fields every member must share: they fix the data each stay's tensor comes from, the
#: split the calibration map is fitted on, and the read-out of the mean anchor logits.
SHARED_CONFIG = ("task", "feature_set", "data", "loss", "temperature", "loss_params",
                 "calibration_fraction", "train_prevalence", "max_train_stays")
#: Checkpoint entries every member must share (the served pipeline before the graph).
SHARED_CHECKPOINT = ("n_features", "n_static", "label_names", "normalizer", "static")


@dataclasses.dataclass
class Member:
    """One trained run: its model, objective and checkpoint dict."""

    run: Path
    model: AnchorModel
    criterion: CombinedLoss
    checkpoint: dict[str, Any]

    @property
    def config(self) -> TrainConfig:
        return TrainConfig(**self.checkpoint["config"])


def load_members(runs: Sequence[str | Path]) -> list[Member]:
    """Load the runs' checkpoints; ValueError naming the run and field where two disagree."""
    if not runs:
        raise ValueError("an ensemble needs at least one member run")
    members = []
    for run in map(Path, runs):
        files = RunArtifacts(run)
        files.require(files.checkpoint)
        model, crit, ck = load_checkpoint(files.checkpoint)
        members.append(Member(run, model, crit, ck))
    first = members[0]
    for m in members[1:]:
        for key in SHARED_CONFIG:
            a, b = first.checkpoint["config"].get(key), m.checkpoint["config"].get(key)
            if a != b:
                raise ValueError(f"ensemble members must share the config field {key!r}: "
                                 f"{first.run} has {a!r}, {m.run} has {b!r}")
        if first.config.data_seed != m.config.data_seed:
            raise ValueError(
                f"ensemble members must share the data split (split_seed): {first.run} drew it "
                f"with {first.config.data_seed}, {m.run} with {m.config.data_seed}; train the "
                "members with one --split-seed")
        for key in SHARED_CHECKPOINT:
            if first.checkpoint[key] != m.checkpoint[key]:
                raise ValueError(f"ensemble members must share {key!r} (the served pipeline "
                                 f"before the graph): {first.run} and {m.run} differ")
    return members


def ensemble_head(heads: Sequence[AnchorHead]) -> AnchorHead:
    """One anchor head on the concatenated z whose logits are the mean of the members' logits.

    Each member's weight [2C, D_k] is scaled by 1/K and the blocks are placed side by side:
    [u_1/K, ..., u_K/K]ᵀ[z_1; ...; z_K] = (1/K) Σ_k u_kᵀz_k, and the same for v.
    """
    n_classes = {h.n_classes for h in heads}
    if len(n_classes) != 1:
        raise ValueError(f"ensemble members predict different numbers of classes: {n_classes}")
    head = AnchorHead(sum(h.dim for h in heads), n_classes.pop())
    with torch.no_grad():
        head.linear.weight.copy_(torch.cat([h.linear.weight for h in heads], dim=1) / len(heads))
    return head


def ensemble_model(members: Sequence[Member]) -> AnchorModel:
    """The members' encoders side by side under `ensemble_head` (eval mode)."""
    ck = members[0].checkpoint
    specs = [{k: m.checkpoint["encoder"][k] for k in ("name", "hparams")} for m in members]
    encoder = build_encoder("ensemble", ck["n_features"], ck["n_static"], members=specs)
    for slot, m in zip(encoder.members, members, strict=True):
        slot.load_state_dict(m.model.encoder.state_dict())
    return AnchorModel(encoder, ensemble_head([m.model.head for m in members])).eval()


def mean_logit_probability(crit: CombinedLoss, logits: Sequence[np.ndarray]) -> np.ndarray:
    """The loss's read-out of the members' mean anchor logits [N, C, 2] -> [N, C]."""
    mean = torch.from_numpy(np.mean(np.stack(logits), axis=0))
    with torch.no_grad():
        return crit.probability(mean).numpy()


def greedy_select(task: str, y: np.ndarray, logits: dict[str, np.ndarray], crit: CombinedLoss,
                  max_members: int | None = None) -> list[tuple[str, float]]:
    """Forward selection (Caruana et al. 2004, without replacement) on validation.

    Starts from the member with the best validation headline metric and adds, one at a time,
    the member that raises the ensemble's metric most; stops when no member raises it. Returns
    the path: (member added, ensemble metric after adding it).
    """
    metric = task_spec(task).headline_metric
    left, chosen, path = list(logits), [], []
    best = -np.inf
    while left and (max_members is None or len(chosen) < max_members):
        scores = {name: task_metrics(task, y, mean_logit_probability(
            crit, [logits[c] for c in [*chosen, name]]))[metric] for name in left}
        name = max(left, key=lambda n: scores[n])
        if scores[name] <= best:
            break
        best = scores[name]
        chosen.append(name)
        left.remove(name)
        path.append((name, float(best)))
    return path


def combine(runs: Sequence[str | Path], out: str | Path, *, n_boot: int | None = None,
            echo: bool = True) -> dict[str, Any]:
    """Write the ensemble of `runs` as a run directory at `out` (checkpoint, predictions,
    metrics) that `scehr export` and `scehr evaluate` read like any run; returns its metrics."""
    t0 = time.perf_counter()
    members = load_members(runs)
    model = ensemble_model(members)
    crit = members[0].criterion
    specs = model.encoder.hparams()
    cfg = dataclasses.replace(members[0].config, out=str(out), encoder="ensemble",
                              encoder_hparams=specs, split_seed=members[0].config.data_seed)
    if n_boot is not None:
        cfg.n_boot = n_boot
    run_dir = Path(out)
    run_dir.mkdir(parents=True, exist_ok=True)
    files = RunArtifacts(run_dir)
    write_json(files.config, cfg.to_dict())
    if echo:
        print(f"ensemble of {len(members)} runs: preparing the data and predicting", flush=True)
    data = prepare(cfg)
    ck = members[0].checkpoint
    torch.save({
        "config": cfg.to_dict(), "state_dict": model.state_dict(),
        "encoder": {"name": "ensemble", "hparams": specs, "out_dim": model.encoder.out_dim,
                    "uses_static": model.encoder.uses_static},
        **{k: ck[k] for k in ("n_features", "n_static", "label_names", "normalizer", "static",
                              "coverage")},
        "best_epoch": [m.checkpoint["best_epoch"] for m in members],
        "members": [str(m.run) for m in members],
    }, files.checkpoint)
    splits = ("val", "test", "calib") if data.calib is not None else ("val", "test")
    preds = {s: predict(model, crit, getattr(data, s)) for s in splits}
    train = predict(model, crit, data.train)
    np.savez_compressed(
        files.predictions,
        **{prediction_key(s, k): v for s, p in preds.items() for k, v in p.items()},
        train_z=train["z"], train_y=train["y"], test_static_raw=data.raw["test"].static_raw,
        test_stays=np.array(data.test.stays), val_stays=np.array(data.val.stays))
    test = preds["test"]
    if echo:
        print(f"test bootstrap: {cfg.n_boot} resamples of {len(data.test)} stays", flush=True)
    final = {
        "run_dir": str(run_dir), "task": cfg.task, "encoder": "ensemble", "loss": cfg.loss,
        "lam": cfg.lam, "seed": cfg.seed, "members": [str(m.run) for m in members],
        "best_epoch": ck["best_epoch"],
        "val": task_metrics(cfg.task, preds["val"]["y"], preds["val"]["probability"],
                            data.label_names),
        "test": task_metrics(cfg.task, test["y"], test["probability"], data.label_names),
        "test_ci": bootstrap_metrics(cfg.task, test["y"], test["probability"],
                                     n_boot=cfg.n_boot, seed=cfg.seed),
        "test_ci_binary": binary_extras(preds["val"], test, cfg.n_boot, cfg.seed)
        if task_spec(cfg.task).binary else None,
        "n": {s: len(getattr(data, s)) for s in ("train", "val", "test")},
        "train_prevalence": data.train.y.numpy().mean(axis=0).tolist(),
        "wall_seconds": time.perf_counter() - t0,
    }
    write_json(files.metrics, final)
    return final


def member_logits(runs: Sequence[str | Path], split: str = "val"
                  ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(y, {run: anchor logits}) of `split` from the runs' saved predictions (no re-scoring)."""
    y, logits = None, {}
    for run in map(Path, runs):
        files = RunArtifacts(run)
        files.require(files.predictions)
        preds = np.load(files.predictions)
        if y is None:
            y = preds[prediction_key(split, "y")]
        elif not np.array_equal(y, preds[prediction_key(split, "y")]):
            raise ValueError(f"{run} was validated on other stays than {runs[0]}: ensemble "
                             "members must share the data split (--split-seed)")
        logits[str(run)] = preds[prediction_key(split, "anchor_logits")]
    assert y is not None
    return y, logits


def select_and_combine(runs: Sequence[str | Path], out: str | Path, *, select: str = "greedy",
                       max_members: int | None = None, n_boot: int | None = None,
                       echo: bool = True) -> dict[str, Any]:
    """Choose the members on validation (`select`: greedy | all), then `combine` them.

    "greedy" keeps the forward-selection path's members; it returns the full set instead when
    that set's validation metric is at least as high (fewer choices made on validation).
    """
    if select not in ("greedy", "all"):
        raise ValueError(f"select must be 'greedy' or 'all', not {select!r}")
    members = load_members(runs)  # refuses incompatible runs before any scoring
    task, crit = members[0].config.task, members[0].criterion
    y, logits = member_logits(runs)
    metric = task_spec(task).headline_metric
    every = task_metrics(task, y, mean_logit_probability(crit, list(logits.values())))[metric]
    chosen = [str(r) for r in runs]
    report: dict[str, Any] = {"metric": metric, f"all_{len(runs)}": float(every)}
    if select == "greedy":
        path = greedy_select(task, y, logits, crit, max_members)
        report["greedy_path"] = [{"member": n, "val": v} for n, v in path]
        if path[-1][1] > every:
            chosen = [n for n, _ in path]
    if echo:
        for row in report.get("greedy_path", []):
            print(f"  + {row['member']}: validation {metric} {row['val']:.4f}", flush=True)
        print(f"  all {len(runs)} members: validation {metric} {every:.4f}; "
              f"chosen: {len(chosen)} members", flush=True)
    final = combine(chosen, out, n_boot=n_boot, echo=echo)
    final["selection"] = report
    write_json(RunArtifacts(Path(out)).metrics, final)
    return final


def member_dir(out: str | Path, seed: int) -> Path:
    return Path(out) / f"member-s{seed}"


def train_ensemble(cfg: TrainConfig, *, echo: bool = True) -> dict[str, Any]:
    """Train one run per seed of `cfg.ensemble_seeds` (one data split), then `combine` them.

    A member whose run is complete (metrics written, with a config that trains the same model)
    is reused, so an interrupted build resumes at the first unfinished member.
    """
    from scehr.training.run import train_run  # the ensemble run itself trains nothing

    if len(set(cfg.ensemble_seeds)) != len(cfg.ensemble_seeds):
        raise ValueError(f"ensemble_seeds repeats a seed: {cfg.ensemble_seeds}")
    out = Path(cfg.out) if cfg.out else Path("runs") / f"{cfg.task}-ensemble-{cfg.loss}"
    runs = []
    for i, seed in enumerate(cfg.ensemble_seeds, 1):
        member = dataclasses.replace(cfg, seed=seed, split_seed=cfg.data_seed, ensemble_seeds=[],
                                     out=str(member_dir(out, seed)), plots=False, tsne=False)
        files = RunArtifacts(Path(member.out))
        if files.metrics.is_file() and files.config.is_file() and \
                _same_config(files.config, member):
            if echo:
                print(f"member {i}/{len(cfg.ensemble_seeds)} (seed {seed}): already trained in "
                      f"{member.out}", flush=True)
        else:
            if echo:
                print(f"member {i}/{len(cfg.ensemble_seeds)} (seed {seed}) -> {member.out}",
                      flush=True)
            train_run(member, echo=echo)
        runs.append(Path(member.out))
    return combine(runs, out, n_boot=cfg.n_boot, echo=echo)


#: Config fields that do not change a trained member: where it was written, its test CIs'
#: resamples, its figures and progress display.
_NOT_THE_MODEL = ("out", "n_boot", "plots", "tsne", "progress")


def _same_config(path: Path, cfg: TrainConfig) -> bool:
    """Whether the run config saved at `path` trains the same model as `cfg` (fields added to
    TrainConfig after the run was saved take their defaults, as when the run was trained)."""
    import json

    try:
        saved = TrainConfig(**json.loads(path.read_text())).to_dict()
    except (TypeError, ValueError):  # a field since removed, or a value no longer valid
        return False
    return all(saved[k] == v for k, v in cfg.to_dict().items() if k not in _NOT_THE_MODEL)
