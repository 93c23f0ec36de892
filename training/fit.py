"""Fit an encoder + anchor head with a contrastive loss; select on validation; evaluate on test.

The data path is deliberately thin: each split is normalised once into contiguous tensors and
batches are index slices of them, so per-step overhead stays far below the model's compute.
"""

from __future__ import annotations

import copy
import csv
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from schemas.run_artifacts import check_checkpoint
from schemas.tasks import task_spec
from schemas.tensorize import Normalizer, StaticImputer
from training.config import TrainConfig
from training.data.splits import SplitArrays, load_split
from training.encoders import build_encoder
from training.heads import AnchorHead
from training.losses import CombinedLoss, build_loss
from training.metrics import headline_metric, task_metrics


class AnchorModel(nn.Module):
    """Encoder Φ followed by the anchor head: (x, lengths, static) -> (z, anchor_logits)."""

    def __init__(self, encoder: nn.Module, head: AnchorHead) -> None:
        super().__init__()
        self.encoder, self.head = encoder, head

    def forward(
        self, x: Tensor, lengths: Tensor, static: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        z = self.encoder(x, lengths, static)
        return z, self.head(z)


@dataclass
class TensorSplit:
    """A split ready for the model: normalised, contiguous, on the training device."""

    x: Tensor
    lengths: Tensor
    static: Tensor
    y: Tensor
    stays: list[str]

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def batch(self, idx: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        lengths = self.lengths[idx]
        t = int(lengths.max())  # trim padding shared by the whole batch
        return self.x[idx, :t], lengths, self.static[idx], self.y[idx]


@dataclass
class Prepared:
    train: TensorSplit
    val: TensorSplit
    test: TensorSplit
    calib: TensorSplit | None
    normalizer: Normalizer
    static_imputer: StaticImputer
    label_names: list[str]
    coverage: dict[str, float]
    raw: dict[str, SplitArrays]


def downsample_positives(y: np.ndarray, prevalence: float, seed: int) -> np.ndarray:
    """Indices keeping every negative and enough positives for the target prevalence."""
    rng = np.random.default_rng(seed)
    pos = np.flatnonzero(y[:, 0] > 0.5)
    neg = np.flatnonzero(y[:, 0] <= 0.5)
    n_pos = max(1, round(prevalence * len(neg) / (1 - prevalence)))
    keep = rng.choice(pos, size=min(n_pos, len(pos)), replace=False)
    return np.sort(np.concatenate([neg, keep]))


def _to_tensors(a: SplitArrays, norm: Normalizer, imp: StaticImputer) -> TensorSplit:
    return TensorSplit(
        torch.from_numpy(norm.transform(a.x, a.lengths)),
        torch.from_numpy(a.lengths.astype(np.int64)),
        torch.from_numpy(imp.transform(a.static_raw)),
        torch.from_numpy(a.y.astype(np.float32)),
        list(a.stays),
    )


def prepare(cfg: TrainConfig) -> Prepared:
    """Load the three splits (cached arrays) and fit normalisation on the training split."""
    fs = cfg.features()
    raw = {s: load_split(cfg.data, cfg.task, s, fs) for s in ("train", "val", "test")}
    check_splits(raw, cfg.task)
    train = raw["train"]
    if cfg.train_prevalence is not None:
        if not task_spec(cfg.task).binary:
            raise ValueError("train_prevalence applies to a binary task (e.g. mortality)")
        train = train.subset(downsample_positives(train.y, cfg.train_prevalence, cfg.seed))
    if cfg.max_train_stays is not None and len(train.stays) > cfg.max_train_stays:
        rng = np.random.default_rng(cfg.seed)
        train = train.subset(np.sort(rng.choice(len(train.stays), cfg.max_train_stays,
                                                replace=False)))
    if cfg.calibration_fraction > 0:
        # Held out of training and of early stopping: the calibration map is fitted here.
        perm = np.random.default_rng(cfg.seed + 1).permutation(len(train.stays))
        k = round(cfg.calibration_fraction * len(perm))
        if 0 < k < len(perm):  # too few stays for a hold-out: no calibration split
            raw["calib"] = train.subset(np.sort(perm[:k]))
            train = train.subset(np.sort(perm[k:]))
    raw["train"] = train
    norm = Normalizer.fit(train.x, train.lengths, fs)
    imp = StaticImputer.fit(train.static_raw)
    cov = {v.id: float(c) for v, c in zip(fs.variables, train.coverage, strict=True)}
    return Prepared(
        *(_to_tensors(raw[s], norm, imp) for s in ("train", "val", "test")),
        calib=_to_tensors(raw["calib"], norm, imp) if "calib" in raw else None,
        normalizer=norm, static_imputer=imp, label_names=list(train.label_names),
        coverage=cov, raw=raw,
    )


def check_splits(raw: dict[str, SplitArrays], task: str) -> None:
    """Refuse, with a clear message, splits that training cannot use.

    An empty split would fail deep inside training or evaluation; a validation split whose
    labels are all equal leaves the selection metric undefined, so no epoch could be chosen.
    """
    for name, split in raw.items():
        if len(split) == 0:
            raise ValueError(f"the {name} split of {task} is empty ({split.split_source or name}"
                             "): training needs stays in train, val and test")
    y = raw["val"].y
    if y.min() == y.max():
        raise ValueError(f"every validation label of {task} is {y.flat[0]:g}: the validation "
                         f"{headline_metric(task)} is undefined, so no epoch can be selected")


def build_model(cfg: TrainConfig, n_features: int, n_static: int, n_classes: int) -> AnchorModel:
    encoder = build_encoder(cfg.encoder, n_features, n_static, **cfg.encoder_hparams)
    return AnchorModel(encoder, AnchorHead(encoder.out_dim, n_classes))


@torch.no_grad()
def predict(
    model: AnchorModel, crit: CombinedLoss, data: TensorSplit, batch_size: int = 1024
) -> dict[str, np.ndarray]:
    """Probabilities, anchor logits and embeddings for a whole split (eval mode)."""
    model.eval()
    zs, logits = [], []
    for i in range(0, len(data), batch_size):
        idx = torch.arange(i, min(i + batch_size, len(data)))
        x, lengths, static, _ = data.batch(idx)
        z, lg = model(x, lengths, static)
        zs.append(z)
        logits.append(lg)
    z, lg = torch.cat(zs), torch.cat(logits)
    return {
        "z": z.numpy(),
        "anchor_logits": lg.numpy(),
        "probability": crit.probability(lg).numpy(),
        "y": data.y.numpy(),
    }


def seed_everything(seed: int) -> torch.Generator:
    torch.manual_seed(seed)
    np.random.seed(seed)
    return torch.Generator().manual_seed(seed)


@dataclass
class FitResult:
    model: AnchorModel
    criterion: CombinedLoss
    history: list[dict[str, float]]
    best_epoch: int
    best_val: float
    train_seconds: float
    stays_per_second: float


def fit(cfg: TrainConfig, data: Prepared, run_dir: Path | None = None) -> FitResult:
    """Adam + gradient clipping + early stopping on the validation headline metric."""
    torch.set_num_threads(cfg.threads)
    gen = seed_everything(cfg.seed)
    n_classes = data.train.y.shape[1]
    model = build_model(cfg, data.train.x.shape[2], data.train.static.shape[1], n_classes)
    crit = criterion(cfg)
    if crit.regularizers:
        crit.prepare(stay_summaries(data.train), data.train.y, model.encoder.out_dim)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    headline = task_spec(cfg.task).headline_metric
    best_val, best_epoch, best_state, bad = -math.inf, -1, None, 0
    history: list[dict[str, float]] = []
    seen, t_train = 0, 0.0
    # disable=None: a bar on a terminal, silence in log files and CI.
    bar = tqdm(range(cfg.epochs), desc="epochs", disable=None if cfg.progress else True,
               unit="ep")
    for epoch in bar:
        model.train()
        t0 = time.perf_counter()
        perm = torch.randperm(len(data.train), generator=gen)
        if crit.needs_epoch_embeddings:
            crit.refresh(torch.from_numpy(predict(model, crit, data.train)["z"]), data.train.y)
            model.train()
        sums: dict[str, float] = {"loss": 0.0}
        n_batches = 0
        for i in range(0, len(perm), cfg.batch_size):
            idx = perm[i : i + cfg.batch_size]
            x, lengths, static, y = data.train.batch(idx)
            z, logits = model(x, lengths, static)
            z2 = None
            if crit.needs_second_view:
                z2, _ = model(x + crit.view_noise * torch.randn_like(x), lengths, static)
            loss, parts = crit(z, logits, y, index=idx, z2=z2)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.clip_grad:
                nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
            opt.step()
            sums["loss"] += loss.item()
            for name, part in parts.items():  # cce, scr, then each regularizer by name
                sums[name] = sums.get(name, 0.0) + part.item()
            n_batches += 1
            bar.set_postfix(loss=f"{sums['loss'] / n_batches:.4f}", best=f"{best_val:.4f}",
                            refresh=False)
        t_train += time.perf_counter() - t0
        seen += len(perm)
        val = predict(model, crit, data.val)
        m = task_metrics(cfg.task, val["y"], val["probability"])
        score = m[headline] if m[headline] is not None else -math.inf
        row = {"epoch": epoch + 1, **{f"train_{k}": v / n_batches for k, v in sums.items()},
               f"val_{headline}": score, "val_auprc": m.get("auprc") or float("nan"),
               "seconds": time.perf_counter() - t0}
        history.append(row)
        if score > best_val:
            best_val, best_epoch, bad = score, epoch + 1, 0
            best_state = copy.deepcopy(model.state_dict())
        else:
            bad += 1
        bar.set_postfix(loss=f"{row['train_loss']:.4f}", val=f"{score:.4f}",
                        best=f"{best_val:.4f}@{best_epoch}")
        if run_dir is not None:
            write_history(run_dir / "epochs.csv", history)
        if bad >= cfg.patience:
            break
    if best_state is not None:
        model.load_state_dict(best_state)
    return FitResult(model, crit, history, best_epoch, best_val, t_train,
                     seen / max(t_train, 1e-9))


def write_history(path: Path, history: list[dict[str, float]]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(history[0]))
        w.writeheader()
        w.writerows(history)


def save_checkpoint(path: Path, cfg: TrainConfig, res: FitResult, data: Prepared) -> None:
    """Everything needed to rebuild the model and export it, without the training data."""
    torch.save({
        "config": cfg.to_dict(),
        "state_dict": res.model.state_dict(),
        "encoder": {"name": cfg.encoder, "hparams": res.model.encoder.hparams(),
                    "out_dim": res.model.encoder.out_dim,
                    "uses_static": res.model.encoder.uses_static},
        "n_features": int(data.train.x.shape[2]),
        "n_static": int(data.train.static.shape[1]),
        "label_names": data.label_names,
        "normalizer": data.normalizer.to_dict(),
        "static": data.static_imputer.to_dict(),
        "coverage": data.coverage,
        "best_epoch": res.best_epoch,
    }, path)


def criterion(cfg: TrainConfig) -> CombinedLoss:
    """The objective a config names: classification term, λ·SCR and its regularizers."""
    return build_loss(cfg.loss, cfg.lam, temperature=cfg.temperature,
                      regularizers=cfg.regularizers, **cfg.loss_params)


def stay_summaries(split: TensorSplit) -> Tensor:
    """[N, F] mean of each (normalised) input column over a stay's observed steps: the prior
    space of attribute-kNN positives and of the debiased loss."""
    out = []
    for i in range(0, len(split), 1024):  # chunks: x * mask would copy the whole split
        x, lengths = split.x[i : i + 1024], split.lengths[i : i + 1024]
        steps = torch.arange(x.shape[1])[None, :, None] < lengths[:, None, None]
        out.append((x * steps).sum(dim=1) / lengths.clamp(min=1)[:, None].to(x))
    return torch.cat(out)


def load_checkpoint(path: Path) -> tuple[AnchorModel, CombinedLoss, dict[str, Any]]:
    ck = torch.load(path, map_location="cpu", weights_only=False)
    check_checkpoint(ck, path)
    cfg = TrainConfig(**ck["config"])
    encoder = build_encoder(ck["encoder"]["name"], ck["n_features"], ck["n_static"],
                            **ck["encoder"]["hparams"])
    model = AnchorModel(encoder, AnchorHead(encoder.out_dim, len(ck["label_names"])))
    model.load_state_dict(ck["state_dict"])
    model.eval()
    crit = criterion(cfg)
    return model, crit, ck


