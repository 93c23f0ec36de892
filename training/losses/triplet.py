"""Triplet margin loss with batch-all or batch-hard mining (Schroff 2015; Hermans 2017).

Input convention: z [B, D] (L2-normalised first by default), binary labels y [B] or [B, C], per
column as in SCR. Triplet loss ℓ_apn = max(0, d_ap − d_an + m), Euclidean d.
- mining="all": mean over the *active* triplets (ℓ > 0), the batch-all convention; this coincides
  with pytorch-metric-learning's TripletMarginLoss (AvgNonZeroReducer). 0 when none is active.
- mining="hard": per anchor the farthest positive and the nearest negative; mean over anchors that
  have both.
Formulas as implemented, and how they fit the objective: docs/method.md.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from scehr.training.losses.base import ColumnPairLoss
from scehr.training.losses.pairwise import (
    euclidean_distance_matrix,
    large_negative,
    masked_mean,
    off_diagonal,
    same_label_masks,
)


class TripletLoss(ColumnPairLoss):
    """Triplet margin loss; `mining` chooses batch-all or batch-hard triplets."""

    def __init__(
        self, margin: float = 0.2, mining: Literal["all", "hard"] = "all", normalize: bool = True
    ) -> None:
        super().__init__()
        if mining not in ("all", "hard"):
            raise ValueError("mining must be 'all' or 'hard'")
        self.margin, self.mining, self.normalize = margin, mining, normalize

    def column_losses(self, z: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        if self.normalize:
            z = F.normalize(z, dim=-1)
        d = euclidean_distance_matrix(z)
        same, diff = same_label_masks(y)
        pos = same & off_diagonal(z.shape[0], device=z.device)  # [C, B, B]
        if self.mining == "hard":
            return self._hard(d, pos, diff)
        # one column at a time: the triplet tensor is [B, B, B] per column
        results = [self._all(d, pos[c], diff[c]) for c in range(y.shape[1])]
        per_column, valid = zip(*results, strict=True)
        return torch.stack(per_column), torch.stack(valid)

    def _all(self, d: Tensor, pos: Tensor, neg: Tensor) -> tuple[Tensor, Tensor]:
        # [a, p, n]: valid where (a, p) is a positive pair and (a, n) a negative pair
        valid = pos.unsqueeze(2) & neg.unsqueeze(1)
        loss = F.relu(d.unsqueeze(2) - d.unsqueeze(1) + self.margin)
        return masked_mean(loss.flatten(), (valid & (loss > 0)).flatten()), valid.any()

    def _hard(self, d: Tensor, pos: Tensor, neg: Tensor) -> tuple[Tensor, Tensor]:
        big = -large_negative(d.dtype)
        hardest_pos = torch.where(pos, d, -big).amax(dim=-1)  # [C, B]
        hardest_neg = torch.where(neg, d, big).amin(dim=-1)
        has_both = pos.any(-1) & neg.any(-1)
        # where() before relu keeps the ±big fillers out of the arithmetic of invalid anchors
        gap = torch.where(has_both, hardest_pos - hardest_neg, torch.zeros_like(hardest_pos))
        return masked_mean(F.relu(gap + self.margin), has_both), has_both.any(dim=-1)

    def extra_repr(self) -> str:
        return f"margin={self.margin}, mining={self.mining!r}, normalize={self.normalize}"
