"""Shared pieces for pair losses: similarity/distance matrices, label masks, masked reductions.

Every contrastive loss in this package is composed from these helpers so that masking, numerical
stability and the "no valid anchor -> 0, never NaN" rule are written exactly once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def large_negative(dtype: torch.dtype) -> float:
    """A finite stand-in for -inf: exp() underflows to 0 but arithmetic never yields NaN."""
    return torch.finfo(dtype).min / 4


def cosine_similarity_matrix(a: Tensor, b: Tensor | None = None) -> Tensor:
    """s_ij = â_iᵀb̂_j with x̂ = x/‖x‖ ([N, D] x [M, D] -> [N, M]); zero rows stay zero."""
    a_hat = F.normalize(a, dim=-1)
    b_hat = a_hat if b is None else F.normalize(b, dim=-1)
    return a_hat @ b_hat.transpose(-1, -2)


def euclidean_distance_matrix(z: Tensor, squared: bool = False) -> Tensor:
    """Pairwise Euclidean distances [B, B] with a finite (zero) gradient at coincident points.

    Differences are formed explicitly (not ‖a‖²+‖b‖²−2aᵀb) so that small distances are exact.
    """
    d2 = (z.unsqueeze(1) - z.unsqueeze(0)).pow(2).sum(-1)
    if squared:
        return d2
    positive = d2 > 0
    # double-where: sqrt'(0) is infinite, so feed sqrt a harmless 1 where the distance is 0
    return torch.where(positive, torch.sqrt(torch.where(positive, d2, torch.ones_like(d2))), 0.0)


def label_matrix(y: Tensor, batch_size: int | None = None) -> Tensor:
    """Binary labels as a [B, C] matrix: accepts y [B] (one column) or y [B, C]."""
    if y.dim() == 1:
        y = y.unsqueeze(1)
    if y.dim() != 2:
        raise ValueError(f"labels must be [B] or [B, C], got shape {tuple(y.shape)}")
    if batch_size is not None and y.shape[0] != batch_size:
        raise ValueError(f"labels have {y.shape[0]} rows for a batch of {batch_size}")
    return y


def off_diagonal(n: int, m: int | None = None, device: torch.device | None = None) -> Tensor:
    """Bool [n, m] that is False where row index == column index (a sample is not its own pair)."""
    m = n if m is None else m
    rows = torch.arange(n, device=device).unsqueeze(1)
    cols = torch.arange(m, device=device).unsqueeze(0)
    return rows != cols


def same_label_masks(y_rows: Tensor, y_cols: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Per-column (same, different) label masks [C, N, M] from label matrices [N, C] and [M, C].

    The diagonal is *not* removed here; combine with `off_diagonal` where rows and columns are the
    same samples.
    """
    y_cols = y_rows if y_cols is None else y_cols
    a = y_rows.transpose(0, 1).unsqueeze(2)  # [C, N, 1]
    b = y_cols.transpose(0, 1).unsqueeze(1)  # [C, 1, M]
    same = a == b
    return same, ~same


def informative_columns(y: Tensor) -> Tensor:
    """[C] bool: columns where both labels occur (a constant column carries no contrast)."""
    return (y != y[:1]).any(dim=0)


def masked_log_softmax(logits: Tensor, valid: Tensor) -> Tensor:
    """log softmax over the `valid` entries of the last axis; invalid entries get a finite value.

    Uses a large finite negative (not -inf) so rows with no valid entry (a batch of one) stay finite
    and produce zero, not NaN, gradients.
    """
    filled = logits.masked_fill(~valid, large_negative(logits.dtype))
    return filled - torch.logsumexp(filled, dim=-1, keepdim=True)


def log1m_softmax(log_prob: Tensor, valid: Tensor) -> Tensor:
    """log(1 − p) for p = exp(log_prob), exact even when one entry holds nearly all the mass.

    For entries with p ≤ 1/2, log1p(−p) is accurate. Only a row's largest entry can exceed 1/2;
    for it 1 − p is the mass of the *other* valid entries, summed directly in log space instead
    of by cancellation (which would give log 0 = -inf in float32 once p rounds to 1).
    """
    neg = large_negative(log_prob.dtype)
    masked = log_prob.masked_fill(~valid, neg)
    top = masked.argmax(dim=-1, keepdim=True)
    is_top = torch.zeros_like(valid).scatter(-1, top, True)
    rest = torch.logsumexp(masked.masked_fill(is_top, neg), dim=-1, keepdim=True)
    safe = torch.where(is_top, torch.full_like(masked, -1.0), masked)  # keeps log1p off −1
    return torch.where(is_top, rest.expand_as(masked), torch.log1p(-torch.exp(safe)))


def masked_mean(values: Tensor, mask: Tensor, dim: int = -1) -> Tensor:
    """Mean of `values` over `mask` along `dim`; 0 where the mask is empty (never 0/0)."""
    total = torch.where(mask, values, torch.zeros_like(values)).sum(dim)
    return total / mask.sum(dim).clamp(min=1).to(values.dtype)


def supcon_anchor_losses(
    log_prob: Tensor, positives: Tensor, weight: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Per-anchor SupCon terms −(1/|P(i)|) Σ_{j∈P(i)} w_ij log p_ij and which anchors have a P(i).

    `log_prob` [..., B, K] and `positives` [..., B, K] broadcast against each other (e.g. one shared
    similarity matrix against per-class positive masks [C, B, K]). `weight` (same broadcast) is an
    optional per-pair factor (the focal term of AFCL).
    """
    terms = log_prob if weight is None else weight * log_prob
    terms, positives = torch.broadcast_tensors(terms, positives)
    return -masked_mean(terms, positives), positives.any(dim=-1)


def mean_over_kept(per_column: Tensor, kept: Tensor, anchor: Tensor) -> Tensor:
    """Mean over the kept columns; exactly 0 (with zero gradient, still attached) when none is kept.

    `anchor` (usually the embeddings) keeps the result in the autograd graph in the degenerate case,
    so callers can always call backward().
    """
    return masked_mean(per_column, kept, dim=0) + anchor.sum() * 0.0
