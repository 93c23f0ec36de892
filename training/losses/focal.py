"""Binary focal loss (Lin et al. 2017) on the positive anchor logit uᵀz.

Input convention: anchor_logits [B, C, 2] (only index 0, uᵀz, is used), targets y float [B, C].
Formulas as implemented, and how they fit the objective: docs/method.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from scehr.training.losses.base import AnchorLoss


class FocalLoss(AnchorLoss):
    """−α_t (1 − p_t)^γ log p_t with p = σ(uᵀz); α_t = α for y=1 and 1−α for y=0 (None: no α).

    The modulating factor is computed as exp(γ log(1 − p_t)) from logsigmoid, so it is finite and
    differentiable for any γ ≥ 0 and any logit size.
    """

    positive_anchor_only = True

    def __init__(self, gamma: float = 2.0, alpha: float | None = None) -> None:
        super().__init__()
        if gamma < 0:
            raise ValueError("gamma must be >= 0")
        if alpha is not None and not 0.0 <= alpha <= 1.0:
            raise ValueError("alpha must lie in [0, 1]")
        self.gamma = gamma
        self.alpha = alpha

    def elementwise(self, u: Tensor, v: Tensor, y: Tensor) -> Tensor:
        log_p, log_1mp = F.logsigmoid(u), F.logsigmoid(-u)
        log_pt = y * log_p + (1 - y) * log_1mp
        log_1m_pt = y * log_1mp + (1 - y) * log_p
        loss = -torch.exp(self.gamma * log_1m_pt) * log_pt
        if self.alpha is not None:
            loss = (y * self.alpha + (1 - y) * (1 - self.alpha)) * loss
        return loss

    @staticmethod
    def probability(anchor_logits: Tensor) -> Tensor:
        """p = σ(uᵀz)."""
        return torch.sigmoid(anchor_logits[..., 0])

    def extra_repr(self) -> str:
        return f"gamma={self.gamma}, alpha={self.alpha}"
