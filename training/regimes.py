"""Training regimes beyond one-stage joint training (`regime` in the config).

- `joint`: classification term + λ·SCR + weighted regularizers, one stage (the default).
- `two_stage`: as the asymmetric-contrastive-loss work trains: the encoder is first trained
  with a contrastive objective alone (`pretrain.objective` = acl, afcl or supcon, on the
  labelled training stays), then frozen (eval mode, no dropout) while a fresh head is trained
  with the config's `loss` (cbce/csce: the anchor head; bce: a linear head on uᵀz).
- Both pre-training regimes put the contrastive loss on a projection g(z) (`pretrain.projection`
  = "mlp", the default: Linear-ReLU-Linear to 2·dim(z), discarded after pre-training, as SupCon
  and SimCLR do) rather than on z itself. On z itself ("none") binary SupCon/AFCL on PhysioNet
  2012 collapsed every stay to one point (mean val cosine 0.9997, the frozen-encoder head 0.55
  test AUROC), a stationary point of the loss; with the projection z keeps its spread.
- `ssl`: self-supervised pre-training with patient-specific views: the two views of a stay
  are two non-overlapping time segments of it (a random cut between 25% and 75% of its
  length), NT-Xent over the batch; it reads every training stay, labelled or not. Then the
  whole model is fine-tuned with the config's `loss` (the anchor head) on the labelled stays.

`label_fraction` keeps only that share of the training stays' labels (stratified by the first
label, at least one stay per class): the stays without labels still feed SSL pre-training.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from scehr.training.losses.ntxent import NTXent
from scehr.training.losses.regularizers import Batch, build_regularizer

#: regime -> the phases it trains, in order ("pretrain": encoder only; "train": with a head).
REGIME_PHASES: dict[str, tuple[str, ...]] = {
    "joint": ("train",),
    "two_stage": ("pretrain", "train"),
    "ssl": ("pretrain", "train"),
}
#: regime -> the pre-training objectives it accepts (supcon = SCR, the supervised contrast).
PRETRAIN_OBJECTIVES: dict[str, tuple[str, ...]] = {
    "two_stage": ("acl", "afcl", "supcon"),
    "ssl": ("ntxent_segments",),
}
#: Keys of the `[pretrain]` table besides the objective's own parameters.
PRETRAIN_KEYS = ("objective", "epochs", "lr", "projection")
#: `pretrain.projection` values; the first is the default.
PROJECTIONS = ("mlp", "none")


def check_regime(regime: str, pretrain: dict[str, Any], lam: float,
                 regularizers: dict[str, Any]) -> None:
    """A clear error for a regime the loop cannot train, naming the field and the rule."""
    if regime not in REGIME_PHASES:
        raise ValueError(f"regime must be one of {', '.join(REGIME_PHASES)}, not {regime!r}")
    if regime == "joint":
        if pretrain:
            raise ValueError("pretrain applies to regime = 'two_stage' or 'ssl', not 'joint'")
        return
    objective = pretrain.get("objective")
    if objective not in PRETRAIN_OBJECTIVES[regime]:
        raise ValueError(f"pretrain.objective of regime {regime!r} must be one of "
                         f"{', '.join(PRETRAIN_OBJECTIVES[regime])}, not {objective!r}")
    if not isinstance(pretrain.get("epochs", 10), int) or pretrain.get("epochs", 10) < 1:
        raise ValueError("pretrain.epochs must be an integer >= 1")
    if pretrain.get("projection", PROJECTIONS[0]) not in PROJECTIONS:
        raise ValueError(f"pretrain.projection must be one of {', '.join(PROJECTIONS)}, not "
                         f"{pretrain.get('projection')!r}")
    if regime == "two_stage" and (lam or regularizers):
        raise ValueError("regime 'two_stage' trains the head on a frozen encoder: lam must be "
                         "0 and regularizers empty (the contrast belongs in [pretrain])")


def projection_head(pretrain: dict[str, Any], dim: int) -> nn.Module | None:
    """The pre-training projection g of an encoder with `dim`-wide z (None: the loss sees z)."""
    if pretrain.get("projection", PROJECTIONS[0]) == "none":
        return None
    return nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, 2 * dim))


def labelled_rows(y: np.ndarray, fraction: float | None, seed: int) -> np.ndarray:
    """Sorted row indices of the stays whose labels are kept (all when fraction is None)."""
    n = len(y)
    if fraction is None or fraction >= 1:
        return np.arange(n)
    rng = np.random.default_rng(seed + 2)
    keep = []
    for cls in (True, False):  # stratified by the first label; at least one stay per class
        rows = np.flatnonzero((y[:, 0] > 0.5) == cls)
        if len(rows):
            keep.append(rng.choice(rows, size=max(1, round(fraction * len(rows))),
                                   replace=False))
    return np.sort(np.concatenate(keep))


def segment_views(x: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Two non-overlapping time segments per stay: steps [0, c) and [c, L), c drawn per stay
    between 25% and 75% of L (global torch RNG, so a resumed run draws the same cuts).

    Returns (x1, lengths1, x2, lengths2); each view is trimmed to its longest segment and the
    second is shifted to start at step 0. A one-step stay gives the same step twice.
    """
    lengths = lengths.clamp(min=1)
    lo = (0.25 * lengths).floor().clamp(min=1)
    hi = (0.75 * lengths).ceil().clamp(min=1)
    cut = (lo + torch.rand(lengths.shape) * (hi - lo + 1)).floor().long()
    cut = torch.minimum(cut, (lengths - 1).clamp(min=1))
    len1, len2 = cut, (lengths - cut).clamp(min=1)
    t1, t2 = int(len1.max()), int(len2.max())
    steps = torch.arange(t2)[None, :] + torch.minimum(cut, lengths - 1)[:, None]
    steps = steps.clamp(max=x.shape[1] - 1)
    x2 = torch.gather(x, 1, steps[:, :, None].expand(-1, -1, x.shape[2]))
    return x[:, :t1], len1, x2, len2


@dataclass
class PretrainStep:
    """The pre-training loss of a batch in two parts, so that a distributed step can embed its
    own rows of each view and gather them before the loss: `views` (the encoder inputs: two
    segments per stay for SSL, the stay itself otherwise) and `loss` of the views' embeddings.
    Called as f(embed, x, lengths, static, y, idx) it does both on one process, where
    embed(x, lengths, static) is g(Φ(x)) (or Φ(x) without a projection)."""

    name: str
    ssl: bool
    objective: Callable[..., Tensor]

    def views(self, x: Tensor, lengths: Tensor) -> list[tuple[Tensor, Tensor]]:
        if not self.ssl:
            return [(x, lengths)]
        x1, l1, x2, l2 = segment_views(x, lengths)
        return [(x1, l1), (x2, l2)]

    def loss(self, zs: list[Tensor], y: Tensor, idx: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        loss = (self.objective(*zs) if self.ssl
                else self.objective(Batch(zs[0], zs[0].new_zeros(0), y, idx)))
        return loss, {self.name: loss}

    def __call__(self, embed: Callable[..., Tensor], x: Tensor, lengths: Tensor,
                 static: Tensor, y: Tensor, idx: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        return self.loss([embed(xv, lv, static) for xv, lv in self.views(x, lengths)], y, idx)


def pretrain_step(regime: str, pretrain: dict[str, Any]) -> PretrainStep:
    """The pre-training loss of a regime (`PretrainStep`); the objective's own parameters come
    from `pretrain`."""
    name = pretrain["objective"]
    params = {k: v for k, v in pretrain.items() if k not in PRETRAIN_KEYS}
    if regime == "ssl":
        return PretrainStep(name, True, NTXent(**params))
    return PretrainStep(name, False, build_regularizer("scr" if name == "supcon" else name,
                                                       **params))
