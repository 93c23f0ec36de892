"""Margin contrastive loss (Hadsell, Chopra & LeCun 2006) on Euclidean distances.

Input convention: z [B, D] (raw, or L2-normalised first with normalize=True), binary labels y [B] or
[B, C], per column as in SCR. Over all ordered pairs i ≠ j:
    ℓ_ij = ½ d_ij²                  if y_i = y_j   (pull together)
    ℓ_ij = ½ max(0, m − d_ij)²      otherwise      (push apart up to the margin m)
and the column loss is the mean over pairs.
Formulas as implemented, and how they fit the objective: docs/method.md.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from scehr.training.losses.base import ColumnPairLoss
from scehr.training.losses.pairwise import (
    euclidean_distance_matrix,
    masked_mean,
    off_diagonal,
    same_label_masks,
)


class MarginContrastiveLoss(ColumnPairLoss):
    """Hadsell et al. pairwise contrastive loss with margin m on the Euclidean distance."""

    def __init__(self, margin: float = 1.0, normalize: bool = False) -> None:
        super().__init__()
        if margin <= 0:
            raise ValueError("margin must be > 0")
        self.margin, self.normalize = margin, normalize

    def column_losses(self, z: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        if self.normalize:
            z = F.normalize(z, dim=-1)
        d2 = euclidean_distance_matrix(z, squared=True)
        push = F.relu(self.margin - euclidean_distance_matrix(z)).pow(2)
        same, _ = same_label_masks(y)
        pair_loss = 0.5 * (same * d2 + (~same) * push)  # [C, B, B]
        others = off_diagonal(z.shape[0], device=z.device).expand_as(pair_loss)
        per_column = masked_mean(pair_loss.flatten(1), others.flatten(1))
        return per_column, others.flatten(1).any(dim=-1)

    def extra_repr(self) -> str:
        return f"margin={self.margin}, normalize={self.normalize}"
