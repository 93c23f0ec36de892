"""Choosing k positives per anchor for a supervised contrastive loss ("Bootstrapping Your Own
Positive Sample", contrastive learning with EHR data, 2023).

Instead of treating *every* same-label sample as a positive, each anchor keeps k of them:
- `KRandomPositives(k)`: k random same-label samples of the batch;
- `FeatureKNNPositives(k)`: the k nearest same-label samples by cosine similarity of embeddings
  stored by `refresh(embeddings, labels)` once per epoch (so the graph tracks the encoder);
- `AttributeKNNPositives(k)`: the k nearest same-label samples by Euclidean distance on raw
  features standardised once by `fit(features, labels)` before training.
Input convention: labels y [B] or [B, C] (same label = identical row), dataset row indices
`index` [B] for the kNN selectors. `mask(y, index)` gives a bool [B, B] positive mask (diagonal
False) for `SupConWithPositives`; `neighbours(index)` gives the kNN graph rows as dataset indices.
Formulas as implemented, and how they fit the objective: docs/method.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scehr.training.losses.pairwise import (
    cosine_similarity_matrix,
    label_matrix,
    masked_log_softmax,
    masked_mean,
    mean_over_kept,
    off_diagonal,
    supcon_anchor_losses,
)


def same_row_mask(y: Tensor, y_ref: Tensor | None = None) -> Tensor:
    """[N, M] bool: the label rows are identical (for y [N] this is plain label equality)."""
    y = label_matrix(y)
    y_ref = y if y_ref is None else label_matrix(y_ref)
    return (y.unsqueeze(1) == y_ref.unsqueeze(0)).all(dim=-1)


def top_k_mask(scores: Tensor, candidates: Tensor, k: int) -> Tensor:
    """[B, M] bool: per row the k highest-scoring candidates (all of them if there are fewer)."""
    k = min(k, scores.shape[1])
    if k <= 0:
        return torch.zeros_like(candidates)
    idx = scores.masked_fill(~candidates, float("-inf")).topk(k, dim=1).indices
    return torch.zeros_like(candidates).scatter(1, idx, True) & candidates


class PositiveSelector:
    """Base: picks up to k same-label partners per anchor; subclasses define the ranking score."""

    def __init__(self, k: int) -> None:
        if k < 1:
            raise ValueError("k must be >= 1")
        self.k = k

    def mask(self, y: Tensor, index: Tensor | None = None) -> Tensor:
        """Bool [B, B] positive mask, diagonal False."""
        candidates = same_row_mask(y) & off_diagonal(y.shape[0], device=y.device)
        return top_k_mask(self.scores(y, index), candidates, self.k)

    def scores(self, y: Tensor, index: Tensor | None) -> Tensor:
        """[B, B] ranking score, higher = preferred partner."""
        raise NotImplementedError


class KRandomPositives(PositiveSelector):
    """k same-label partners drawn uniformly at random from the batch, fresh each call."""

    def __init__(self, k: int, generator: torch.Generator | None = None) -> None:
        super().__init__(k)
        self.generator = generator

    def scores(self, y: Tensor, index: Tensor | None) -> Tensor:
        n = y.shape[0]
        return torch.rand(n, n, generator=self.generator).to(y.device)


class _StoredKNN(PositiveSelector):
    """kNN over a stored per-sample representation `bank` [N, F] with labels `bank_labels`."""

    bank: Tensor | None = None
    bank_labels: Tensor | None = None

    def similarity(self, a: Tensor, b: Tensor) -> Tensor:
        raise NotImplementedError

    def _stored(self) -> tuple[Tensor, Tensor]:
        if self.bank is None or self.bank_labels is None:
            raise RuntimeError(f"{type(self).__name__} has no stored representation yet")
        return self.bank, self.bank_labels

    def scores(self, y: Tensor, index: Tensor | None) -> Tensor:
        if index is None:
            raise ValueError("kNN positives need the dataset row index of each batch sample")
        bank, _ = self._stored()
        rep = bank[index.to(bank.device)]
        return self.similarity(rep, rep).to(y.device)

    def neighbours(self, index: Tensor) -> Tensor:
        """[B, k] dataset indices of each sample's k nearest same-label stored samples (−1 pads)."""
        bank, labels = self._stored()
        index = index.to(bank.device)
        candidates = same_row_mask(labels[index], labels)
        candidates[torch.arange(len(index)), index] = False
        scores = self.similarity(bank[index], bank).masked_fill(~candidates, float("-inf"))
        top = scores.topk(min(self.k, bank.shape[0]), dim=1)
        return top.indices.masked_fill(top.values == float("-inf"), -1)


class FeatureKNNPositives(_StoredKNN):
    """k nearest same-label samples in embedding space (cosine), refreshed once per epoch."""

    def refresh(self, embeddings: Tensor, labels: Tensor) -> None:
        """Store the epoch's embeddings [N, D] (detached, unit norm) and labels [N] or [N, C]."""
        self.bank = F.normalize(embeddings.detach(), dim=-1)
        self.bank_labels = labels.detach()

    def similarity(self, a: Tensor, b: Tensor) -> Tensor:
        return a @ b.T


class AttributeKNNPositives(_StoredKNN):
    """k nearest same-label samples by Euclidean distance on standardised raw features.

    `fit` runs once before training; missing values (NaN) are imputed with the column mean, i.e. 0
    after standardising, and constant columns are left unscaled.
    """

    def fit(self, features: Tensor, labels: Tensor) -> None:
        """Standardise features [N, F] and store them with labels [N] or [N, C]."""
        x = torch.as_tensor(features, dtype=torch.float32)
        mean = torch.nanmean(x, dim=0)
        std = torch.nanmean((x - mean).pow(2), dim=0).sqrt()
        std = torch.where(std > 0, std, torch.ones_like(std))
        self.mean, self.std = mean, std
        self.bank = torch.nan_to_num((x - mean) / std, nan=0.0)
        self.bank_labels = torch.as_tensor(labels)

    def similarity(self, a: Tensor, b: Tensor) -> Tensor:
        return -torch.cdist(a, b)


class SupConWithPositives(nn.Module):
    """SupCon/SCR with an explicit positive mask: −mean_{i∈A} (1/|P(i)|) Σ_{j∈P(i)} log p_ij.

    Input: z [B, D], positives bool [B, B] (e.g. from a `PositiveSelector`), optional candidates
    bool [B, B] restricting the softmax denominator (default: every k ≠ i). The diagonal is always
    excluded. Anchors without a positive are left out; 0 (zero gradient) if none has one.
    """

    def __init__(self, temperature: float = 0.1) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError("temperature must be > 0")
        self.temperature = temperature

    def forward(self, z: Tensor, positives: Tensor, candidates: Tensor | None = None) -> Tensor:
        others = off_diagonal(z.shape[0], device=z.device)
        candidates = others if candidates is None else candidates & others
        log_prob = masked_log_softmax(cosine_similarity_matrix(z) / self.temperature, candidates)
        anchor_loss, has_pos = supcon_anchor_losses(log_prob, positives & candidates)
        return mean_over_kept(
            masked_mean(anchor_loss, has_pos).unsqueeze(0), has_pos.any()[None], z
        )

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}"
