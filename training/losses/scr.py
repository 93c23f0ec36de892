"""SCR, the supervised contrastive regularizer of SCEHR (docs/method.md, "Regularizers").

Input convention: z [B, D] (any scale: cosine similarity is used), binary labels y [B] or [B, C].
Per class column c: s_ij = ẑ_iᵀẑ_j, P(i) = {j ≠ i : y_jc = y_ic}, A = {i : P(i) ≠ ∅},
    SCR_c = −(1/|A|) Σ_{i∈A} 1/|P(i)| Σ_{j∈P(i)} log[exp(s_ij/τ) / Σ_{k≠i} exp(s_ik/τ)];
constant columns are left out, the result is the mean over kept columns, 0 if none.
"""

from __future__ import annotations

from torch import Tensor

from scehr.training.losses.base import ColumnPairLoss
from scehr.training.losses.pairwise import (
    cosine_similarity_matrix,
    masked_log_softmax,
    masked_mean,
    off_diagonal,
    same_label_masks,
    supcon_anchor_losses,
)


class SCR(ColumnPairLoss):
    """Supervised contrastive regularizer; equals SupCon on a column where every anchor has a pair.

    Unlike the authors' code there is no hidden base-temperature factor (theirs is 1/0.7 larger).
    """

    def __init__(self, temperature: float = 0.1) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError("temperature must be > 0")
        self.temperature = temperature

    def column_losses(self, z: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        others = off_diagonal(z.shape[0], device=z.device)
        # the softmax denominator runs over all k ≠ i and does not depend on the labels,
        # so one [B, B] log-probability matrix serves every class column
        log_prob = masked_log_softmax(cosine_similarity_matrix(z) / self.temperature, others)
        same, _ = same_label_masks(y)
        anchor_loss, has_pos = supcon_anchor_losses(log_prob, same & others)  # [C, B] each
        return masked_mean(anchor_loss, has_pos), has_pos.any(dim=-1)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}"
