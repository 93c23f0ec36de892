"""Asymmetric contrastive losses ACL and AFCL (Vito & Stefanus 2022, "An Asymmetric Contrastive
Loss for Handling Imbalanced Datasets").

Input convention: z [B, D] (cosine similarity), binary labels y [B] or [B, C], per column as in SCR.
With p_ij = exp(s_ij/τ) / Σ_{k≠i} exp(s_ik/τ), for every anchor i with P(i) ≠ ∅:
    ℓ_i = (1/|P(i)|) Σ_{j∈P(i)} −(1 − p_ij)^γ log p_ij  +  η (1/|N(i)|) Σ_{n∈N(i)} −log(1 − p_in)
N(i) = {n : y_n ≠ y_i}. γ = η = 0 gives SCR exactly; γ = 0 is ACL; η = 0 is the focal contrastive
loss (FCL). The authors' released code divides both sums by the batch size B instead of by |P(i)|
and |N(i)| and averages over all anchors, so their η values (up to ~300) are on a different scale.
Formulas as implemented, and how they fit the objective: docs/method.md.
"""

from __future__ import annotations

import torch
from torch import Tensor

from scehr.training.losses.base import ColumnPairLoss
from scehr.training.losses.pairwise import (
    cosine_similarity_matrix,
    log1m_softmax,
    masked_log_softmax,
    masked_mean,
    off_diagonal,
    same_label_masks,
    supcon_anchor_losses,
)


class AFCL(ColumnPairLoss):
    """Asymmetric focal contrastive loss: focal weight (1 − p)^γ on positives, η·(−log(1 − p)) on
    negatives."""

    def __init__(self, eta: float = 0.0, gamma: float = 0.0, temperature: float = 0.1) -> None:
        super().__init__()
        if eta < 0 or gamma < 0 or temperature <= 0:
            raise ValueError("need eta >= 0, gamma >= 0, temperature > 0")
        self.eta, self.gamma, self.temperature = eta, gamma, temperature

    def column_losses(self, z: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        others = off_diagonal(z.shape[0], device=z.device)
        log_prob = masked_log_softmax(cosine_similarity_matrix(z) / self.temperature, others)
        log_1mp = log1m_softmax(log_prob, others)
        same, diff = same_label_masks(y)
        pos, neg = same & others, diff & others
        weight = torch.exp(self.gamma * log_1mp) if self.gamma else None
        anchor_loss, has_pos = supcon_anchor_losses(log_prob, pos, weight)
        if self.eta:
            anchor_loss = anchor_loss + self.eta * masked_mean(-log_1mp.expand_as(neg), neg)
        return masked_mean(anchor_loss, has_pos), has_pos.any(dim=-1)

    def extra_repr(self) -> str:
        return f"eta={self.eta}, gamma={self.gamma}, temperature={self.temperature}"


class ACL(AFCL):
    """Asymmetric contrastive loss: SupCon plus η·(−log(1 − p_in)) averaged over negatives."""

    def __init__(self, eta: float = 0.0, temperature: float = 0.1) -> None:
        super().__init__(eta=eta, gamma=0.0, temperature=temperature)
