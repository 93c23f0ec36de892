"""Three training steps of every objective of the registries, on one process or under torchrun.

The equivalence test runs `steps(...)` in its own process and this file under
`torchrun --nproc-per-node 2 distributed_steps.py DATA OUT [DTYPE]`; rank 0 saves what the processes
computed to OUT/steps.pt. The steps are global batches of 13 stays (7 + 6 rows on two
processes), 13 again (the debiased loss's queue then holds the first batch), and 1 (the
second process has no row of it).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from scehr.training.config import TrainConfig
from scehr.training.distributed import init_from_env
from scehr.training.encoders import TRAINABLE
from scehr.training.fit import LoopState, _Fit, prepare
from scehr.training.losses import CCE_LOSSES, REGULARIZERS
from scehr.training.regimes import PRETRAIN_OBJECTIVES

BATCH_SIZES = (13, 13, 1)

#: Without gradient clipping: clipping would rescale a gradient of the wrong size (e.g. half
#: the right one) to the same norm as the right one.
BASE: dict[str, Any] = {
    "task": "mortality", "encoder": "lstm", "batch_size": 13, "epochs": 1, "threads": 1,
    "seed": 0, "channel_dropout": 0.2, "progress": False, "calibration_fraction": 0.0,
    "clip_grad": 0.0,
    "encoder_hparams": {"units": 4, "depth": 1, "bidirectional": False, "dropout": 0.0,
                        "static": True},
}


def cases() -> dict[str, dict[str, Any]]:
    """Every classification term (with SCR, λ > 0), every regularizer on top of CBCE (SCR is
    weighted by λ instead), every pre-training objective of every regime, and every trainable
    encoder (CBCE + SCR): a name the registries gain is a new case."""
    out: dict[str, dict[str, Any]] = {
        f"loss-{name}": {"loss": name, "lam": 0.5} for name in CCE_LOSSES}
    for name in REGULARIZERS:
        if name != "scr":
            out[f"regularizer-{name}"] = {"loss": "cbce", "lam": 0.1,
                                          "regularizers": {name: {"weight": 1.0}}}
    for regime, objectives in PRETRAIN_OBJECTIVES.items():
        for objective in objectives:
            out[f"pretrain-{regime}-{objective}"] = {
                "loss": "cbce", "lam": 0.0, "regime": regime,
                "pretrain": {"objective": objective, "epochs": 1}}
    for name in TRAINABLE:
        out[f"encoder-{name}"] = {"loss": "cbce", "lam": 0.5, "encoder": name,
                                  "encoder_hparams": {"dropout": 0.0}}
    return out


def steps(data: Path, case: str, dtype: torch.dtype = torch.float64) -> dict[str, Any]:
    """Each step's loss (and named parts) and the gradients it left on every parameter.

    In float64 by default: the two sides then differ by float64 rounding only, so a tolerance
    of 1e-6 tells a wrong gradient from a different order of summation (in float32 that order
    alone moves gradients by up to ~1e-6).
    """
    cfg = TrainConfig(**{**BASE, **cases()[case]}, data=str(data))
    prepared = prepare(cfg)
    for split in (prepared.train, prepared.val, prepared.test):
        split.x, split.static, split.y = (t.to(dtype) for t in (split.x, split.static, split.y))
    fit = _Fit.start(cfg, prepared, None, None, None)
    fit.model.to(dtype)
    fit.crit.to(dtype)
    fit.wrap(fit.st.phase)  # DDP again, on the converted parameters
    pre = fit.st.phase == "pretrain"
    split = fit.data.train if pre and cfg.regime == "ssl" else fit.labelled
    fit.begin_epoch(split, pre)
    rows = torch.cat(fit.st.batches or [])
    ends = torch.tensor(BATCH_SIZES).cumsum(0).tolist()
    fit.st.batches = [rows[e - n:e] for n, e in zip(BATCH_SIZES, ends, strict=True)]
    record: dict[str, Any] = {"sums": [], "grads": []}

    def keep(st: LoopState) -> None:
        record["sums"].append(dict(st.sums))
        record["grads"].append({k: p.grad.clone() for k, p in fit.model.named_parameters()
                                if p.grad is not None})
    fit.on_step = keep
    for _ in BATCH_SIZES:
        fit.train_step(split, pre)
    return record


if __name__ == "__main__":
    world = init_from_env()
    data_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    dtype = getattr(torch, sys.argv[3]) if len(sys.argv) > 3 else torch.float64
    results = {case: steps(data_dir, case, dtype) for case in cases()}
    if world.is_main:
        torch.save({"world_size": world.size, "results": results}, out / "steps.pt")
