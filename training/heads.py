"""The SCEHR anchor head: per class a positive anchor u_c and a negative anchor v_c.
Formulas as implemented, and how they fit the objective: docs/method.md.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class AnchorHead(nn.Module):
    """Bias-free linear map z [B, D] -> anchor_logits [B, C, 2] = (u_cᵀz, v_cᵀz).

    `linear.weight` [2C, D] viewed as [C, 2, D] holds u_c at index 0 and v_c at index 1, so the
    forward pass is one matmul and one reshape (exports to ONNX as MatMul + Reshape).
    """

    def __init__(self, dim: int, n_classes: int) -> None:
        super().__init__()
        self.dim, self.n_classes = dim, n_classes
        self.linear = nn.Linear(dim, 2 * n_classes, bias=False)

    def forward(self, z: Tensor) -> Tensor:
        return self.linear(z).reshape(-1, self.n_classes, 2)

    def anchors(self) -> tuple[Tensor, Tensor]:
        """Detached copies (u [C, D], v [C, D]), e.g. for the manifest and explanations."""
        with torch.no_grad():
            w = self.linear.weight.reshape(self.n_classes, 2, self.dim)
            return w[:, 0].clone(), w[:, 1].clone()

    def extra_repr(self) -> str:
        return f"dim={self.dim}, n_classes={self.n_classes}"
