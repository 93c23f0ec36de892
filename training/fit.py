"""Fit an encoder + anchor head with a contrastive loss; select on validation; evaluate on test.

The data path is deliberately thin: each split is normalised once into contiguous tensors and
batches are index slices of them, so per-step overhead stays far below the model's compute.
"""

from __future__ import annotations

import copy
import csv
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from scehr.schemas.run_artifacts import check_checkpoint
from scehr.schemas.tasks import task_spec
from scehr.schemas.tensorize import Normalizer, StaticImputer
from scehr.training.channel_dropout import ChannelDropout
from scehr.training.config import TrainConfig
from scehr.training.data.splits import SplitArrays, concat_splits, load_split
from scehr.training.distributed import (
    World,
    agree,
    barrier,
    current_world,
    data_parallel,
    gather_rows,
    local_rng,
)
from scehr.training.encoders import build_encoder
from scehr.training.heads import AnchorHead
from scehr.training.interrupt import StopRequest, TrainingInterrupted
from scehr.training.landmark import LandmarkObjective, predict_hours, selection_score
from scehr.training.losses import CombinedLoss, build_loss
from scehr.training.metrics import headline_metric, task_metrics
from scehr.training.progress import RunLog, format_epoch
from scehr.training.regimes import (
    REGIME_PHASES,
    PretrainStep,
    labelled_rows,
    pretrain_step,
    projection_head,
)


class AnchorModel(nn.Module):
    """Encoder Φ followed by the anchor head: (x, lengths, static) -> (z, anchor_logits)."""

    def __init__(self, encoder: nn.Module, head: AnchorHead,
                 projection: nn.Module | None = None) -> None:
        super().__init__()
        self.encoder, self.head = encoder, head
        #: g of contrastive pre-training (regimes.projection_head); dropped once it ends.
        self.projection = projection

    def pretrain_embedding(self, x: Tensor, lengths: Tensor,
                           static: Tensor | None = None) -> Tensor:
        """What the pre-training loss sees: g(Φ(x)), or Φ(x) without a projection."""
        z = self.encoder(x, lengths, static)
        return z if self.projection is None else self.projection(z)

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

    @property
    def n_features(self) -> int:
        return int(self.x.shape[2])

    @property
    def width(self) -> int:
        """Time steps of the split's tensor (batches trim the padding they share)."""
        return int(self.x.shape[1])

    def prefetch(self, batches: list[Tensor]) -> None:
        """The batches about to be read, in order: in memory, nothing to read ahead (a streamed
        split, `data.streaming.StreamedSplit`, starts its loader workers on them)."""

    def subset(self, idx: Tensor) -> TensorSplit:
        return TensorSplit(self.x[idx], self.lengths[idx], self.static[idx], self.y[idx],
                           [self.stays[i] for i in idx.tolist()])

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


def load_sources(cfg: TrainConfig, split: str) -> SplitArrays:
    """`split` of `cfg.data`; for train and val, joined by the same split of every
    `cfg.extra_data` source (multi-source training). The test split is `cfg.data`'s alone."""
    fs = cfg.features()
    roots = [cfg.data, *(cfg.extra_data if split != "test" else [])]
    parts = [load_split(r, cfg.task, split, fs) for r in roots]
    return concat_splits(parts, [Path(r).name for r in roots])


def prepare(cfg: TrainConfig) -> Prepared:
    """Load the three splits (cached arrays; with `cfg.stream`, indexes whose stays are read
    batch by batch) and fit normalisation on the training split."""
    fs = cfg.features()
    if cfg.stream:  # the splits' indexes: their stays are read batch by batch, never whole
        from scehr.training.data import streaming

        raw = {s: streaming.index_split(cfg.data, cfg.task, s, fs)
               for s in ("train", "val", "test")}
    else:
        raw = {s: load_sources(cfg, s) for s in ("train", "val", "test")}
    check_splits(raw, cfg.task)
    whole = raw["train"]
    train = raw["train"] = hold_out(cfg, raw)
    if cfg.stream:
        data = streaming.stream_splits(raw, cfg.workers, cfg.cache_stays,
                                       from_masks=train is not whole)
        return Prepared(*(data.splits[s] for s in ("train", "val", "test")),
                        calib=data.splits.get("calib"), normalizer=data.normalizer,
                        static_imputer=data.static_imputer, label_names=list(train.label_names),
                        coverage=data.coverage, raw=raw)
    norm = Normalizer.fit(train.x, train.lengths, fs)
    imp = StaticImputer.fit(train.static_raw)
    cov = {v.id: float(c) for v, c in zip(fs.variables, train.coverage, strict=True)}
    return Prepared(
        *(_to_tensors(raw[s], norm, imp) for s in ("train", "val", "test")),
        calib=_to_tensors(raw["calib"], norm, imp) if "calib" in raw else None,
        normalizer=norm, static_imputer=imp, label_names=list(train.label_names),
        coverage=cov, raw=raw,
    )


def hold_out(cfg: TrainConfig, raw: dict[str, Any]) -> Any:
    """The training stays `cfg` keeps of `raw["train"]` (down-sampled positives, at most
    `max_train_stays`), less the calibration hold-out, which goes to `raw["calib"]`. Needs only
    the split's labels and `subset`, so in-memory and streamed splits are cut alike."""
    train = raw["train"]
    if cfg.train_prevalence is not None:
        if not task_spec(cfg.task).binary:
            raise ValueError("train_prevalence applies to a binary task (e.g. mortality)")
        train = train.subset(downsample_positives(train.y, cfg.train_prevalence, cfg.data_seed))
    if cfg.max_train_stays is not None and len(train.stays) > cfg.max_train_stays:
        rng = np.random.default_rng(cfg.data_seed)
        train = train.subset(np.sort(rng.choice(len(train.stays), cfg.max_train_stays,
                                                replace=False)))
    if cfg.calibration_fraction > 0:
        # Held out of training and of early stopping: the calibration map is fitted here.
        perm = np.random.default_rng(cfg.data_seed + 1).permutation(len(train.stays))
        k = round(cfg.calibration_fraction * len(perm))
        if 0 < k < len(perm):  # too few stays for a hold-out: no calibration split
            raw["calib"] = train.subset(np.sort(perm[:k]))
            train = train.subset(np.sort(perm[k:]))
    return train


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
    projection = (projection_head(cfg.pretrain, encoder.out_dim)
                  if "pretrain" in REGIME_PHASES[cfg.regime] else None)
    return AnchorModel(encoder, AnchorHead(encoder.out_dim, n_classes), projection)


@torch.no_grad()
def predict(
    model: AnchorModel, crit: CombinedLoss, data: TensorSplit, batch_size: int = 1024
) -> dict[str, np.ndarray]:
    """Probabilities, anchor logits and embeddings for a whole split (eval mode), on the
    model's device; the results come back to the CPU."""
    model.eval()
    dev = next(model.parameters()).device
    zs, logits = [], []
    batches = list(torch.arange(len(data)).split(batch_size))
    data.prefetch(batches)
    for idx in batches:
        x, lengths, static, _ = data.batch(idx)
        z, lg = model(x.to(dev), lengths.to(dev), static.to(dev))
        zs.append(z.cpu())
        logits.append(lg.cpu())
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
    pretrain_history: list[dict[str, float]] = field(default_factory=list)


#: The resume checkpoint in a run folder: written on SIGINT/SIGTERM, removed once the run ends.
RESUME_FILE = "resume.pt"


@dataclass
class LoopState:
    """Where the loop is: phase, finished epochs, the current epoch's batches and position,
    early-stopping bookkeeping. With the model, optimizer, criterion and RNG states it is
    everything a resumed run needs to continue exactly as an uninterrupted one."""

    phase: str
    epoch: int = 0
    batches: list[Tensor] | None = None
    next_batch: int = 0
    sums: dict[str, float] = field(default_factory=dict)
    epoch_seconds: float = 0.0
    best_val: float = -math.inf
    best_epoch: int = -1
    best_state: dict[str, Tensor] | None = None
    bad: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    pretrain_history: list[dict[str, float]] = field(default_factory=list)
    seen: int = 0
    t_train: float = 0.0


def make_batches(split: TensorSplit, batch_size: int, gen: torch.Generator,
                 buckets: bool) -> list[Tensor]:
    """One epoch's batches of row indices, drawn from `gen`.

    Without buckets: a random permutation cut into batches. With buckets: the permutation is
    cut into chunks of 50 batches, each chunk sorted by stay length and cut into batches, and
    the batch order shuffled, so a batch pads to the longest of similar stays only.
    """
    perm = torch.randperm(len(split), generator=gen)
    if not buckets:
        return list(perm.split(batch_size))
    out: list[Tensor] = []
    for chunk in perm.split(50 * batch_size):
        order = torch.argsort(split.lengths[chunk], stable=True)
        out.extend(chunk[order].split(batch_size))
    return [out[i] for i in torch.randperm(len(out), generator=gen).tolist()]


def _phase_setup(cfg: TrainConfig, phase: str, model: AnchorModel) -> torch.optim.Optimizer:
    """Freeze/unfreeze for the phase and return its optimizer (fresh Adam state)."""
    frozen = cfg.regime == "two_stage" and phase == "train"
    for param in model.encoder.parameters():
        param.requires_grad_(not frozen)
    if phase == "pretrain":
        params = list(model.encoder.parameters())
        if model.projection is not None:
            params += list(model.projection.parameters())
        lr = float(cfg.pretrain.get("lr", cfg.lr))
    else:
        if cfg.regime != "joint":  # a fresh head on the pre-trained encoder; g is discarded
            model.head = AnchorHead(model.encoder.out_dim, model.head.n_classes)
            model.projection = None
        params = [p for p in model.parameters() if p.requires_grad]
        lr = cfg.lr
    return torch.optim.Adam(params, lr=lr, weight_decay=cfg.weight_decay)


def _rng_states(gen: torch.Generator) -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "gen": gen.get_state(),
            "numpy": np.random.get_state()}


def _set_rng_states(states: dict[str, Any], gen: torch.Generator) -> None:
    torch.set_rng_state(states["torch"])
    gen.set_state(states["gen"])
    np.random.set_state(states["numpy"])


def fit(cfg: TrainConfig, data: Prepared, run_dir: Path | None = None, *,
        resume: dict[str, Any] | None = None, echo: bool = True,
        on_step: Callable[[LoopState], None] | None = None) -> FitResult:
    """Adam + gradient clipping + early stopping on the validation headline metric.

    Runs the regime's phases (training/regimes.py). SIGINT/SIGTERM stop after the current
    step: the loop writes `<run_dir>/resume.pt` and raises TrainingInterrupted; `resume` (that
    file, loaded) continues to the same weights and metrics as an uninterrupted run (on one
    thread; several threads may reorder float sums). `on_step` is called after every step.
    The steps of the loop are the methods of `_Fit`, in the order they run.
    """
    return _Fit.start(cfg, data, run_dir, resume, on_step).run(echo)


@dataclass
class _Fit:
    """One call of `fit`: the model, its objective and optimizer, and the loop's state, so that
    each step of the loop (start, begin an epoch, one batch, end an epoch, stop) has a name."""

    cfg: TrainConfig
    data: Prepared
    run_dir: Path | None
    gen: torch.Generator
    #: The training processes (training/distributed.py); one process: rank 0 of 1.
    world: World = field(default_factory=World, init=False)
    #: The model under DistributedDataParallel for the current phase (several processes).
    ddp: nn.Module | None = field(default=None, init=False)
    model: AnchorModel
    crit: CombinedLoss
    labelled: TensorSplit
    phases: tuple[str, ...]
    st: LoopState
    opt: torch.optim.Optimizer
    headline: str
    pre_step: PretrainStep | None
    on_step: Callable[[LoopState], None] | None
    resumed: bool
    channel_dropout: ChannelDropout
    #: A landmark task's objective over (stay, hour) rows; None: one row per stay.
    landmarks: LandmarkObjective | None = None

    @classmethod
    def start(cls, cfg: TrainConfig, data: Prepared, run_dir: Path | None,
              resume: dict[str, Any] | None, on_step: Callable[[LoopState], None] | None
              ) -> _Fit:
        """Seed, build the model and objective, keep the labelled stays, and either start the
        first phase or restore a stopped run's state."""
        torch.set_num_threads(cfg.threads)
        gen = seed_everything(cfg.seed)
        n_classes = data.train.y.shape[1]
        model = build_model(cfg, data.train.n_features, data.train.static.shape[1], n_classes)
        crit = criterion(cfg)
        labelled = data.train
        if cfg.label_fraction is not None:
            rows = labelled_rows(data.train.y.numpy(), cfg.label_fraction, cfg.seed)
            labelled = data.train.subset(torch.from_numpy(rows))
        if crit.regularizers:
            crit.prepare(stay_summaries(labelled), labelled.y, model.encoder.out_dim)
        model.to(current_world().device)  # before a resumed optimizer's state is loaded
        phases = tuple(REGIME_PHASES[cfg.regime])
        st = LoopState(phase=phases[0])
        if resume is not None:
            st = resume["loop"]
            for phase in phases[: phases.index(st.phase) + 1]:
                opt = _phase_setup(cfg, phase, model)
            model.load_state_dict(resume["model"])
            opt.load_state_dict(resume["optimizer"])
            crit = resume["criterion"]
            _set_rng_states(resume["rng"], gen)
        else:
            opt = _phase_setup(cfg, st.phase, model)
        pre_step = pretrain_step(cfg.regime, cfg.pretrain) if "pretrain" in phases else None
        return cls(cfg, data, run_dir, gen, model, crit, labelled, phases, st, opt,
                   task_spec(cfg.task).headline_metric, pre_step, on_step, resume is not None,
                   ChannelDropout(cfg.features(), data.normalizer, cfg.channel_dropout,
                                  cfg.channel_dropout_groups),
                   LandmarkObjective.from_config(cfg.landmark)
                   if task_spec(cfg.task).landmarks else None)

    def __post_init__(self) -> None:
        """On several processes: the objective on this process's device, and the model under
        DistributedDataParallel."""
        self.world = current_world()
        self.crit.to(self.world.device)
        self.wrap(self.st.phase)

    def wrap(self, phase: str) -> None:
        """On several processes: the model under DistributedDataParallel for `phase` (built
        after the phase's optimizer, once it has frozen what it freezes)."""
        if self.world.active:
            pre = phase == "pretrain"
            self.ddp = data_parallel(self.model, "pretrain_embedding" if pre else "forward",
                                     self.world, unused_parameters=pre)

    def checkpoint(self, where: str, signum: int) -> None:
        """Write the resume checkpoint (with a run folder) and stop the run.

        On several processes rank 0 writes it (the others have no run folder) and every
        process waits for it: the state is the same on all of them, and nothing in it depends
        on the number of processes (global batches, shared generators), so a run resumes on
        any number of processes.
        """
        if self.run_dir is not None:
            torch.save({"config": self.cfg.to_dict(), "loop": self.st,
                        "model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                        "criterion": self.crit, "rng": _rng_states(self.gen)},
                       self.run_dir / RESUME_FILE)
        barrier(self.world)
        raise TrainingInterrupted(self.run_dir, where, signum)

    def run(self, echo: bool) -> FitResult:
        """Every phase's epochs from where the state stands; then the best epoch's weights."""
        cfg, st = self.cfg, self.st
        with RunLog(self.run_dir, bar=cfg.progress, echo=echo) as log, StopRequest() as stop:
            if self.resumed:
                log.line(f"resumed at {st.phase} epoch {st.epoch + 1}, step {st.next_batch}")
            for phase in self.phases[self.phases.index(st.phase):]:
                if phase != st.phase:  # the next phase starts: fresh optimizer, epoch count
                    st.phase, st.epoch, st.batches = phase, 0, None
                    self.opt = _phase_setup(cfg, phase, self.model)
                    self.wrap(phase)
                pre = phase == "pretrain"
                split = self.data.train if pre and cfg.regime == "ssl" else self.labelled
                total = int(cfg.pretrain.get("epochs", 10)) if pre else cfg.epochs
                log.start_bar(total, st.epoch, "pre-training" if pre else "epochs")
                while st.epoch < total:
                    t0 = time.perf_counter()
                    self.begin_epoch(split, pre)
                    while st.next_batch < len(st.batches or ()):
                        self.train_step(split, pre)
                        if agree(stop.requested, self.world):
                            st.epoch_seconds += time.perf_counter() - t0
                            self.checkpoint(f"{phase} epoch {st.epoch + 1}, step "
                                            f"{st.next_batch}", stop.signum or 2)
                    st.epoch_seconds += time.perf_counter() - t0
                    row = self.finish_epoch()
                    if pre:
                        self.log_pretrain_epoch(row, total, log)
                    elif self.validate(row, total, log):
                        break
        return self.result()

    def begin_epoch(self, split: TensorSplit, pre: bool) -> None:
        """Train mode (the frozen encoder of a two-stage head phase stays in eval mode), and a
        new epoch's batches unless a resumed epoch still has some."""
        st = self.st
        self.model.train()
        if self.cfg.regime == "two_stage" and not pre:
            self.model.encoder.eval()  # frozen: no dropout either
        if st.batches is None:
            st.batches = make_batches(split, self.cfg.batch_size, self.gen, self.cfg.buckets)
            st.next_batch, st.sums, st.epoch_seconds = 0, {"loss": 0.0}, 0.0
            if not pre and self.crit.needs_epoch_embeddings:
                self.crit.refresh(torch.from_numpy(predict(self.model, self.crit, split)["z"]),
                                  split.y)
                self.model.train()
        split.prefetch(st.batches[st.next_batch:])

    def train_step(self, split: TensorSplit, pre: bool) -> None:
        """One batch: forward, the objective (or the pre-training loss), backward, clipping,
        the optimizer step, and the running sums of each named part of the loss."""
        st, cfg = self.st, self.cfg
        assert st.batches is not None
        idx = st.batches[st.next_batch]
        x, lengths, static, y = split.batch(idx)
        x = self.channel_dropout(x, lengths, self.gen)
        if self.world.active:
            loss, parts = self.global_loss(x, lengths, static, y, idx, pre)
        elif pre:
            assert self.pre_step is not None
            loss, parts = self.pre_step(self.model.pretrain_embedding, x, lengths, static, y, idx)
        elif self.landmarks is not None:
            z, logits, y = self.landmarks.rows(self.model, x, lengths, static, y, self.gen)
            loss, parts = self.crit(z, logits, y)
        else:
            z, logits = self.model(x, lengths, static)
            z2 = None
            if self.crit.needs_second_view:
                z2, _ = self.model(x + self.crit.view_noise * torch.randn_like(x), lengths,
                                   static)
            loss, parts = self.crit(z, logits, y, index=idx, z2=z2)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.clip_grad:
            nn.utils.clip_grad_norm_(
                [p for g in self.opt.param_groups for p in g["params"]], cfg.clip_grad)
        self.opt.step()
        st.sums["loss"] += loss.item()
        for name, part in parts.items():  # cce, scr, then regularizers by name
            st.sums[name] = st.sums.get(name, 0.0) + part.item()
        st.next_batch += 1
        if not pre:
            st.seen += len(idx)
        if self.on_step is not None:
            self.on_step(st)

    def global_loss(self, x: Tensor, lengths: Tensor, static: Tensor, y: Tensor, idx: Tensor,
                    pre: bool) -> tuple[Tensor, dict[str, Tensor]]:
        """The objective of a global batch on several processes: the inputs and their random
        draws over the whole batch (as one process draws them), the encoder on this process's
        rows, the outputs gathered with their gradients, the objective over the whole batch
        (training/distributed.py says why the gradients then equal one process's)."""
        if pre:
            assert self.pre_step is not None
            views = self.pre_step.views(x, lengths)
        else:
            views = [(x, lengths)]
            if self.crit.needs_second_view:
                views.append((x + self.crit.view_noise * torch.randn_like(x), lengths))
        n, rows, dev = len(idx), self.world.rows(len(idx)), self.world.device
        local = [_own_rows(xv, lv, rows, dev) for xv, lv in views]
        key = (self.cfg.seed, self.phases.index(self.st.phase), self.st.epoch,
               self.st.next_batch)
        assert self.ddp is not None
        with local_rng(self.world, key):
            outs = self.ddp(local, _own_rows(static, None, rows, dev)[0])
        if pre:
            assert self.pre_step is not None
            return self.pre_step.loss([gather_rows(z, self.world, n) for z in outs], y.to(dev),
                                      idx)
        (z, logits), *second = outs
        z2 = gather_rows(second[0][0], self.world, n) if second else None
        return self.crit(gather_rows(z, self.world, n), gather_rows(logits, self.world, n),
                         y.to(dev), index=idx, z2=z2)

    def finish_epoch(self) -> dict[str, Any]:
        """The epoch's row of mean training losses; the state moves to the next epoch."""
        st = self.st
        n = len(st.batches or ())
        row: dict[str, Any] = {"epoch": st.epoch + 1,
                               **{f"train_{k}": v / n for k, v in st.sums.items()}}
        st.epoch += 1
        st.batches = None
        return row

    def log_pretrain_epoch(self, row: dict[str, Any], total: int, log: RunLog) -> None:
        st = self.st
        row = {"phase": "pretrain", **row, "seconds": st.epoch_seconds}
        st.pretrain_history.append(row)
        log.line(format_epoch(row, total, self.headline, st.best_val, st.best_epoch))
        log.update_bar(loss=f"{row['train_loss']:.4f}")
        if self.run_dir is not None:
            write_history(self.run_dir / "pretrain.csv", st.pretrain_history)

    def validate(self, row: dict[str, Any], total: int, log: RunLog) -> bool:
        """Score the validation split, keep the best epoch's weights, log the epoch; True when
        early stopping ends the phase."""
        st, headline = self.st, self.headline
        st.t_train += st.epoch_seconds
        t_val = time.perf_counter()
        val = predict(self.model, self.crit, self.data.val)
        m = task_metrics(self.cfg.task, val["y"], val["probability"])
        score = m[headline] if m[headline] is not None else -math.inf
        if self.landmarks is not None:  # landmark runs: the mean over the landmark hours
            score = selection_score(self.cfg.task, headline,
                                    predict_hours(self.model, self.crit, self.data.val))
        row.update({f"val_{headline}": score,
                    "val_auprc": m.get("auprc") or float("nan"),
                    "seconds": st.epoch_seconds + time.perf_counter() - t_val})
        st.history.append(row)
        if score > st.best_val:
            st.best_val, st.best_epoch, st.bad = score, st.epoch, 0
            st.best_state = copy.deepcopy(self.model.state_dict())
        else:
            st.bad += 1
        log.line(format_epoch(row, total, headline, st.best_val, st.best_epoch))
        log.update_bar(loss=f"{row['train_loss']:.4f}", val=f"{score:.4f}",
                       best=f"{st.best_val:.4f}@{st.best_epoch}")
        if self.run_dir is not None:
            write_history(self.run_dir / "epochs.csv", st.history)
        if st.bad >= self.cfg.patience:
            log.line(f"early stop: no better validation {headline} for "
                     f"{self.cfg.patience} epochs")
            return True
        return False

    def result(self) -> FitResult:
        """The best epoch's weights in eval mode, with the run's history and speed."""
        st = self.st
        if st.best_state is not None:
            self.model.load_state_dict(st.best_state)
        self.model.eval()
        return FitResult(self.model, self.crit, st.history, st.best_epoch, st.best_val,
                         st.t_train, st.seen / max(st.t_train, 1e-9), st.pretrain_history)


def _own_rows(x: Tensor, lengths: Tensor | None, rows: slice, dev: torch.device
              ) -> tuple[Tensor, Tensor | None]:
    """A process's rows of a global batch on its device, trimmed to their longest stay. A
    process without rows (a last batch smaller than the number of processes) runs the first
    row as a stand-in: `gather_rows` drops its output, so it adds no gradient."""
    if rows.start == rows.stop:
        rows = slice(0, 1)
    x = x[rows]
    if lengths is None:
        return x.to(dev), None
    lengths = lengths[rows]
    return x[:, : int(lengths.max())].to(dev), lengths.to(dev)


def load_resume(run_dir: Path) -> dict[str, Any]:
    """The resume checkpoint of a run folder, with a clear error when there is none."""
    path = Path(run_dir) / RESUME_FILE
    if not path.is_file():
        done = (Path(run_dir) / "metrics.json").is_file()
        raise FileNotFoundError(f"{path} does not exist: " + (
            "the run finished" if done else "the run was not stopped by SIGINT/SIGTERM"))
    return torch.load(path, map_location="cpu", weights_only=False)


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
        "n_features": data.train.n_features,
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
    space of attribute-kNN positives and of the debiased loss.

    Read by `batch` 1,024 stays at a time, so a streamed split (`data.streaming.StreamedSplit`)
    gives the same summaries in one pass without ever being whole in memory (the result is
    O(stays), like its labels)."""
    out = []
    for idx in torch.arange(len(split)).split(1024):  # chunks: x * mask would copy the split
        x, lengths, _, _ = split.batch(idx)
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


