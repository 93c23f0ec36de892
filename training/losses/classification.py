"""Anchor-based classification losses of SCEHR: BCE, CBCE (product form) and CSCE (ratio form).

Input convention: anchor_logits [B, C, 2] = (u_cᵀz, v_cᵀz) from `AnchorHead`, targets y float
[B, C] in {0, 1} (y [B] accepted for C = 1). All log-likelihoods are written with logsigmoid /
log_softmax, never as the log of a product of sigmoids, so they stay finite for large logits.
Formulas as implemented, and how they fit the objective: docs/method.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from scehr.training.losses.base import AnchorLoss


class BCE(AnchorLoss):
    """Plain binary cross-entropy on the positive anchor only: −[y log σ(u) + (1−y) log σ(−u)]."""

    positive_anchor_only = True

    def elementwise(self, u: Tensor, v: Tensor, y: Tensor) -> Tensor:
        return -(y * F.logsigmoid(u) + (1 - y) * F.logsigmoid(-u))

    @staticmethod
    def probability(anchor_logits: Tensor) -> Tensor:
        """p = σ(uᵀz)."""
        return torch.sigmoid(anchor_logits[..., 0])


class CBCE(AnchorLoss):
    """Contrastive BCE, product form: −[y log σ(u)σ(−v) + (1−y) log σ(v)σ(−u)].

    Each label pulls z toward its own anchor and pushes it from the other one. (The authors' code
    averages two BCE terms, i.e. half of this value.)
    """

    def elementwise(self, u: Tensor, v: Tensor, y: Tensor) -> Tensor:
        pos = F.logsigmoid(u) + F.logsigmoid(-v)
        neg = F.logsigmoid(v) + F.logsigmoid(-u)
        return -(y * pos + (1 - y) * neg)

    @staticmethod
    def probability(anchor_logits: Tensor) -> Tensor:
        """The paper's read-out p = σ(u) / (σ(u) + σ(v)).

        Evaluated as σ(log σ(u) − log σ(v)) = σ(softplus(−v) − softplus(−u)): the same number
        without the 0/0 that the literal ratio hits when both logits are very negative (σ
        underflows). Sigmoid and Softplus are plain ONNX operators.
        """
        u, v = anchor_logits[..., 0], anchor_logits[..., 1]
        return torch.sigmoid(F.softplus(-v) - F.softplus(-u))


class CSCE(AnchorLoss):
    """Contrastive softmax CE, ratio form: a 2-way softmax over (uᵀz, vᵀz)."""

    margin_scored = True

    def elementwise(self, u: Tensor, v: Tensor, y: Tensor) -> Tensor:
        log_p = torch.log_softmax(torch.stack((u, v), dim=-1), dim=-1)
        return -(y * log_p[..., 0] + (1 - y) * log_p[..., 1])

    @staticmethod
    def probability(anchor_logits: Tensor) -> Tensor:
        """p = exp(u) / (exp(u) + exp(v)) = softmax(u, v)[0]."""
        return torch.softmax(anchor_logits, dim=-1)[..., 0]
