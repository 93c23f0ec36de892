"""Two tiny base classes: one for losses on anchor logits, one for per-label-column pair losses."""

from __future__ import annotations

from torch import Tensor, nn

from scehr.training.losses.pairwise import informative_columns, label_matrix, mean_over_kept


def as_targets(anchor_logits: Tensor, y: Tensor) -> Tensor:
    """Targets as float [B, C] matching anchor_logits [B, C, 2]; y [B] is accepted when C == 1."""
    if anchor_logits.dim() != 3 or anchor_logits.shape[-1] != 2:
        raise ValueError(f"anchor_logits must be [B, C, 2], got {tuple(anchor_logits.shape)}")
    if y.dim() == 1 and anchor_logits.shape[1] == 1:
        y = y.unsqueeze(1)
    if y.shape != anchor_logits.shape[:2]:
        raise ValueError(
            f"targets {tuple(y.shape)} do not match logits {tuple(anchor_logits.shape)}"
        )
    return y.to(anchor_logits.dtype)


class AnchorLoss(nn.Module):
    """Classification loss on (uᵀz, vᵀz): subclasses give the elementwise loss and the read-out.

    The reduction is the mean over batch and classes, i.e. (1/C) Σ_c mean_b.
    """

    #: The read-out uses the positive anchor only (p = σ(uᵀz)): v is never trained, so
    #: calibration maps read logit(p) = uᵀz instead of the margin uᵀz − vᵀz.
    positive_anchor_only: bool = False
    #: The read-out is σ(uᵀz − vᵀz), a function of the margin alone: a calibration map of the
    #: margin then ranks stays as the probability does (`combined.calibration_input`).
    margin_scored: bool = False

    def forward(self, anchor_logits: Tensor, y: Tensor) -> Tensor:
        y = as_targets(anchor_logits, y)
        return self.elementwise(anchor_logits[..., 0], anchor_logits[..., 1], y).mean()

    def elementwise(self, u: Tensor, v: Tensor, y: Tensor) -> Tensor:
        """Loss per sample and class [B, C] from u = uᵀz, v = vᵀz and targets y."""
        raise NotImplementedError

    @staticmethod
    def probability(anchor_logits: Tensor) -> Tensor:
        """P(y=1) [B, C]; only ONNX-exportable ops, since the exported graph computes it."""
        raise NotImplementedError


class ColumnPairLoss(nn.Module):
    """Pair loss on embeddings z [B, D] and binary labels y [B] or [B, C], per label column.

    A column whose labels are all equal carries no contrast and is left out; the result is the mean
    over the kept columns, and 0 (zero gradient, never NaN) when none is kept.
    """

    def forward(self, z: Tensor, y: Tensor) -> Tensor:
        y = label_matrix(y, z.shape[0])
        per_column, valid = self.column_losses(z, y)
        return mean_over_kept(per_column, valid & informative_columns(y), z)

    def column_losses(self, z: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """([C] loss per column, [C] bool: the column had something to contrast)."""
        raise NotImplementedError
