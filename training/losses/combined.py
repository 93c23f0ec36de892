"""CCE + λ·SCR, the SCEHR training objective, and a name -> loss registry."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from training.losses.base import AnchorLoss
from training.losses.classification import BCE, CBCE, CSCE
from training.losses.focal import FocalLoss
from training.losses.scr import SCR

CCE_LOSSES: dict[str, type[AnchorLoss]] = {
    "bce": BCE,
    "cbce": CBCE,
    "csce": CSCE,
    "focal": FocalLoss,
}


class CombinedLoss(nn.Module):
    """total = (1/C) Σ_c CCE_c + λ·SCR; forward(z, anchor_logits, y) -> (total, {"cce", "scr"}).

    SCR is always computed (cheap, and worth logging even at λ = 0); `probability` is the CCE's
    read-out, so training, evaluation and the exported graph share one formula.
    """

    def __init__(
        self, cce_name: str, lam: float = 0.0, temperature: float = 0.1, **cce_kwargs: Any
    ) -> None:
        super().__init__()
        if cce_name not in CCE_LOSSES:
            raise ValueError(f"unknown loss {cce_name!r}; valid names: {', '.join(CCE_LOSSES)}")
        if lam < 0:
            raise ValueError("lam must be >= 0")
        self.cce_name, self.lam = cce_name, lam
        self.cce = CCE_LOSSES[cce_name](**cce_kwargs)
        self.scr = SCR(temperature)

    def forward(
        self, z: Tensor, anchor_logits: Tensor, y: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        cce = self.cce(anchor_logits, y)
        scr = self.scr(z, y)
        return cce + self.lam * scr, {"cce": cce, "scr": scr}

    def probability(self, anchor_logits: Tensor) -> Tensor:
        """P(y=1) [B, C] by the CCE's read-out."""
        return self.cce.probability(anchor_logits)

    def extra_repr(self) -> str:
        return f"cce={self.cce_name!r}, lam={self.lam}"


def build_loss(name: str, lam: float = 0.0, **kwargs: Any) -> CombinedLoss:
    """CombinedLoss by CCE name (a key of CCE_LOSSES); kwargs: temperature, gamma, alpha."""
    return CombinedLoss(name, lam, **kwargs)
