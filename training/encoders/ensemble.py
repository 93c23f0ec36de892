"""K trained encoders side by side: z is the concatenation of the members' embeddings.

With the members' anchor heads stacked and scaled by 1/K (`scehr.training.ensemble.ensemble_head`),
one anchor head on this z gives the mean of the members' anchor logits, so an ensemble is an
ordinary anchor model: the same graph contract, calibration and explanations as one member.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from scehr.training.encoders.base import Encoder, build_encoder


class EnsembleEncoder(Encoder):
    """Φ(x) = [Φ_1(x); ...; Φ_K(x)], each member an encoder rebuilt from its name and hparams."""

    name = "ensemble"

    def __init__(self, n_features: int, n_static: int = 0, *,
                 members: list[dict[str, Any]]) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member encoder")
        self._specs = [{"name": m["name"], "hparams": dict(m["hparams"])} for m in members]
        self.members = nn.ModuleList(
            build_encoder(m["name"], n_features, n_static, **m["hparams"]) for m in self._specs)
        self.out_dim = sum(int(m.out_dim) for m in self.members)
        self.uses_static = any(bool(m.uses_static) for m in self.members)

    def forward(self, x: Tensor, lengths: Tensor, static: Tensor | None = None) -> Tensor:
        return torch.cat([m(x, lengths, static if m.uses_static else None)
                          for m in self.members], dim=1)

    def hparams(self) -> dict[str, Any]:
        return {"members": [dict(s) for s in self._specs]}
