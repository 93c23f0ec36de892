"""NT-Xent (SimCLR, Chen et al. 2020): self-supervised contrast between two views of each sample.

Input convention: z1, z2 [B, D], row i of both is the same sample (two augmentations); no labels.
On the 2B stacked views with cosine similarity, each view's positive is its partner view and the
denominator runs over all 2B − 1 other views; the loss is the mean over the 2B anchors.
Formulas as implemented, and how they fit the objective: docs/method.md.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from scehr.training.losses.pairwise import (
    cosine_similarity_matrix,
    masked_log_softmax,
    off_diagonal,
    supcon_anchor_losses,
)


class NTXent(nn.Module):
    """Normalised temperature-scaled cross-entropy over two views."""

    def __init__(self, temperature: float = 0.1) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError("temperature must be > 0")
        self.temperature = temperature

    def forward(self, z1: Tensor, z2: Tensor) -> Tensor:
        if z1.shape != z2.shape:
            raise ValueError("the two views must have the same shape")
        z = torch.cat((z1, z2), dim=0)
        others = off_diagonal(z.shape[0], device=z.device)
        log_prob = masked_log_softmax(cosine_similarity_matrix(z) / self.temperature, others)
        ids = torch.arange(z1.shape[0], device=z.device).repeat(2)
        anchor_loss, _ = supcon_anchor_losses(log_prob, (ids[:, None] == ids[None, :]) & others)
        return anchor_loss.mean()

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}"
