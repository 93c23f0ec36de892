"""Regularizers by name: every contrastive term the training objective can add to the CCE.

Each entry wraps one loss of this package behind one call, `term(batch) -> scalar`, so the
objective (`scehr.training.losses.combined.CombinedLoss`) can sum any of them with weights and log
each by name, the way pytorch-metric-learning's `MultipleLosses` does. Formulas are the wrapped
losses' own (docs/method.md); this module only feeds them.

What a term may need besides (z, y): `index` (dataset rows of the batch, for kNN positives and
the prior of the debiased loss), `z2` (a second view of the batch, for NT-Xent), per-stay
summary `features` of the training split (set once by `prepare`), and the training split's
embeddings once per epoch (`refresh`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from scehr.training.losses.asymmetric import ACL, AFCL
from scehr.training.losses.debias import DebiasedSupCon, MemoryQueue
from scehr.training.losses.margin import MarginContrastiveLoss
from scehr.training.losses.ntxent import NTXent
from scehr.training.losses.positives import (
    AttributeKNNPositives,
    FeatureKNNPositives,
    KRandomPositives,
    PositiveSelector,
    SupConWithPositives,
)
from scehr.training.losses.scr import SCR
from scehr.training.losses.triplet import TripletLoss


@dataclass
class Batch:
    """One training step's tensors, as the objective's terms see them."""

    z: Tensor
    anchor_logits: Tensor
    y: Tensor
    index: Tensor | None = None
    z2: Tensor | None = None


class Regularizer(nn.Module):
    """A named term on the embeddings; subclasses set what they need and compute the loss."""

    #: A second view of each stay (the fit loop then runs the encoder twice per step).
    needs_second_view: bool = False
    #: The training split's embeddings at the start of every epoch (`refresh`).
    needs_epoch_embeddings: bool = False

    def prepare(self, features: Tensor, labels: Tensor, dim: int) -> None:
        """Once before training: per-stay summary features [N, F], labels [N, C], z's size."""

    def refresh(self, embeddings: Tensor, labels: Tensor) -> None:
        """At each epoch start (only if `needs_epoch_embeddings`)."""

    def forward(self, batch: Batch) -> Tensor:
        raise NotImplementedError


class _PairTerm(Regularizer):
    """A loss of (z, y) only: SCR, ACL, AFCL, triplet, margin contrastive."""

    def __init__(self, loss: nn.Module) -> None:
        super().__init__()
        self.loss = loss

    def forward(self, batch: Batch) -> Tensor:
        return self.loss(batch.z, batch.y)


class NTXentTerm(Regularizer):
    """NT-Xent between the batch and a second view (the same stays with Gaussian input noise)."""

    needs_second_view = True

    def __init__(self, temperature: float = 0.1, noise: float = 0.1) -> None:
        super().__init__()
        if noise < 0:
            raise ValueError("noise must be >= 0")
        self.loss, self.noise = NTXent(temperature), noise

    def forward(self, batch: Batch) -> Tensor:
        if batch.z2 is None:
            raise ValueError("ntxent needs a second view (z2) of the batch")
        return self.loss(batch.z, batch.z2)


class SupConPositivesTerm(Regularizer):
    """SupCon with k positives per anchor chosen by a `PositiveSelector`."""

    def __init__(self, selector: PositiveSelector, temperature: float = 0.1) -> None:
        super().__init__()
        self.selector, self.loss = selector, SupConWithPositives(temperature)
        self.needs_epoch_embeddings = isinstance(selector, FeatureKNNPositives)

    def prepare(self, features: Tensor, labels: Tensor, dim: int) -> None:
        if isinstance(self.selector, AttributeKNNPositives):
            self.selector.fit(features, labels)

    def refresh(self, embeddings: Tensor, labels: Tensor) -> None:
        if isinstance(self.selector, FeatureKNNPositives):
            self.selector.refresh(embeddings, labels)

    def forward(self, batch: Batch) -> Tensor:
        return self.loss(batch.z, self.selector.mask(batch.y, batch.index))


class DebiasedTerm(Regularizer):
    """Debiased SupCon against batch + memory queue; the prior is the stays' summary features."""

    def __init__(self, temperature: float = 0.1, threshold: float = 0.9, mode: str = "drop",
                 queue_size: int = 1024) -> None:
        super().__init__()
        self.kwargs = {"temperature": temperature, "threshold": threshold, "mode": mode}
        self.queue_size = queue_size
        self.loss = DebiasedSupCon(**self.kwargs)  # type: ignore[arg-type]
        self.prior: Tensor | None = None

    def prepare(self, features: Tensor, labels: Tensor, dim: int) -> None:
        self.prior = torch.nan_to_num(features.float())
        queue = MemoryQueue(self.queue_size, dim, labels.shape[1], self.prior.shape[1])
        self.loss = DebiasedSupCon(**self.kwargs, queue=queue)  # type: ignore[arg-type]

    def forward(self, batch: Batch) -> Tensor:
        prior = None
        if self.prior is not None and batch.index is not None:
            prior = self.prior[batch.index].to(batch.z)
        return self.loss(batch.z, batch.y, prior)


def _knn(cls: type[PositiveSelector]) -> Callable[..., Regularizer]:
    def build(k: int = 3, temperature: float = 0.1) -> Regularizer:
        return SupConPositivesTerm(cls(k), temperature)
    return build


#: Regularizer name -> factory(**params). The names the config and `--regularizer` accept.
REGULARIZERS: dict[str, Callable[..., Regularizer]] = {
    "scr": lambda temperature=0.1: _PairTerm(SCR(temperature)),
    "acl": lambda eta=1.0, temperature=0.1: _PairTerm(ACL(eta, temperature)),
    "afcl": lambda eta=1.0, gamma=1.0, temperature=0.1: _PairTerm(AFCL(eta, gamma, temperature)),
    "triplet": lambda margin=0.2, mining="all", normalize=True: _PairTerm(
        TripletLoss(margin, mining, normalize)),
    "margin": lambda margin=1.0, normalize=False: _PairTerm(
        MarginContrastiveLoss(margin, normalize)),
    "ntxent": NTXentTerm,
    "supcon_krandom": _knn(KRandomPositives),
    "supcon_knn_feature": _knn(FeatureKNNPositives),
    "supcon_knn_attribute": _knn(AttributeKNNPositives),
    "debiased_supcon": DebiasedTerm,
}


def build_regularizer(name: str, **params: Any) -> Regularizer:
    """The regularizer `name` with its parameters; a clear error for a wrong name or key."""
    if name not in REGULARIZERS:
        raise ValueError(f"unknown regularizer {name!r}; valid names: {', '.join(REGULARIZERS)}")
    factory = REGULARIZERS[name]
    known = list(inspect.signature(factory).parameters)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(f"regularizer {name!r} has no parameter {unknown[0]!r}; its "
                         f"parameters: {', '.join(known)}")
    return factory(**params)
