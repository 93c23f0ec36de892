"""The training objective: a classification term + weighted regularizers, with named parts.

total = (1/C) Σ_c CCE_c + λ·SCR + Σ_r w_r·R_r  (docs/method.md, "The objective"). The
classification terms are `CCE_LOSSES`, the regularizers `regularizers.REGULARIZERS`; SCR keeps
its own weight λ (`lam`) as in the paper, and any other regularizer is added by name with its
weight and parameters. Like pytorch-metric-learning's `MultipleLosses`, the forward pass returns
the total and each part by name, which the fit loop logs per epoch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from torch import Tensor, nn

from scehr.training.losses.base import AnchorLoss
from scehr.training.losses.classification import BCE, CBCE, CSCE
from scehr.training.losses.focal import FocalLoss
from scehr.training.losses.regularizers import Batch, Regularizer, build_regularizer
from scehr.training.losses.scr import SCR

#: Classification term name -> loss class: the one registry of classification losses. Each
#: class also defines the probability read-out and whether it reads the positive anchor only;
#: the CLI's choices, the calibration input and the manifest's loss name all derive from here.
CCE_LOSSES: dict[str, type[AnchorLoss]] = {
    "bce": BCE,
    "cbce": CBCE,
    "csce": CSCE,
    "focal": FocalLoss,
}

#: Losses whose probability ignores the negative anchor (derived from the classes).
POSITIVE_ANCHOR_ONLY: frozenset[str] = frozenset(
    name for name, cls in CCE_LOSSES.items() if cls.positive_anchor_only)


def calibration_input(loss: str) -> Literal["margin", "probability"]:
    """What the calibration maps of a model trained with `loss` read: the margin uᵀz − vᵀz
    where the probability is σ(margin) (CSCE), else logit(p). A map must rank a class's stays
    as its score does: CBCE's σ(u) / (σ(u) + σ(v)) is not a function of the margin, so a map
    of the margin would re-rank them; BCE and focal never train v."""
    cls = CCE_LOSSES.get(loss)
    return "margin" if cls is not None and cls.margin_scored else "probability"


class CombinedLoss(nn.Module):
    """forward(z, anchor_logits, y, ...) -> (total, {"cce", "scr", <regularizer names>}).

    SCR is always computed (cheap, and worth logging even at λ = 0); `probability` is the CCE's
    read-out, so training, evaluation and the exported graph share one formula. `regularizers`
    maps a name of `REGULARIZERS` to its parameters plus `weight` (default 1).
    """

    def __init__(
        self, cce_name: str, lam: float = 0.0, temperature: float = 0.1,
        regularizers: Mapping[str, Mapping[str, Any]] | None = None, **cce_kwargs: Any
    ) -> None:
        super().__init__()
        if cce_name not in CCE_LOSSES:
            raise ValueError(f"unknown loss {cce_name!r}; valid names: {', '.join(CCE_LOSSES)}")
        if not lam >= 0:
            raise ValueError("lam must be >= 0")
        self.cce_name, self.lam = cce_name, lam
        self.cce = CCE_LOSSES[cce_name](**cce_kwargs)
        self.scr = SCR(temperature)
        self.weights: dict[str, float] = {}
        self.terms = nn.ModuleDict()
        for name, params in (regularizers or {}).items():
            if name == "scr":
                raise ValueError("SCR is weighted by lam (--lam), not listed as a regularizer")
            params = dict(params)
            weight = float(params.pop("weight", 1.0))
            if not weight >= 0:
                raise ValueError(f"regularizer {name!r}: weight must be >= 0")
            self.terms[name] = build_regularizer(name, **params)
            self.weights[name] = weight

    @property
    def regularizers(self) -> dict[str, Regularizer]:
        return dict(self.terms.items())  # type: ignore[arg-type]

    @property
    def view_noise(self) -> float:
        """SD of the Gaussian noise making the second view (the largest a term asks for)."""
        return max((getattr(t, "noise", 0.0) for t in self.regularizers.values()), default=0.0)

    def prepare(self, features: Tensor, labels: Tensor, dim: int) -> None:
        for term in self.regularizers.values():
            term.prepare(features, labels, dim)

    def refresh(self, embeddings: Tensor, labels: Tensor) -> None:
        for term in self.regularizers.values():
            if term.needs_epoch_embeddings:
                term.refresh(embeddings, labels)

    @property
    def needs_second_view(self) -> bool:
        return any(t.needs_second_view for t in self.regularizers.values())

    @property
    def needs_epoch_embeddings(self) -> bool:
        return any(t.needs_epoch_embeddings for t in self.regularizers.values())

    def forward(
        self, z: Tensor, anchor_logits: Tensor, y: Tensor, *, index: Tensor | None = None,
        z2: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        cce = self.cce(anchor_logits, y)
        scr = self.scr(z, y)
        total = cce + self.lam * scr
        parts = {"cce": cce, "scr": scr}
        if self.terms:
            batch = Batch(z, anchor_logits, y, index, z2)
            for name, term in self.terms.items():
                parts[name] = term(batch)
                total = total + self.weights[name] * parts[name]
        return total, parts

    def probability(self, anchor_logits: Tensor) -> Tensor:
        """P(y=1) [B, C] by the CCE's read-out."""
        return self.cce.probability(anchor_logits)

    def extra_repr(self) -> str:
        extra = "".join(f", {n}={w}" for n, w in self.weights.items())
        return f"cce={self.cce_name!r}, lam={self.lam}{extra}"


def build_loss(name: str, lam: float = 0.0, **kwargs: Any) -> CombinedLoss:
    """CombinedLoss by CCE name (a key of CCE_LOSSES); kwargs: temperature, regularizers,
    and the CCE's own (gamma, alpha)."""
    return CombinedLoss(name, lam, **kwargs)
