"""ConCare-style encoder: one GRU per channel, demographics as a token, attention across channels.

Each channel keeps its own recurrent summary, so attention can weigh channels against each other
(and against the demographics) per stay; that is what makes channel-level explanations possible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from scehr.training.encoders.base import Encoder, clamp_lengths, last_valid


class ChannelSelfAttention(nn.Module):
    """Post-norm transformer block over channel tokens, written out so the ONNX graph is plain."""

    def __init__(self, dim: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        if dim % n_heads:
            raise ValueError(f"hidden={dim} must be divisible by n_heads={n_heads}")
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, tokens: Tensor) -> Tensor:
        b, k, d = tokens.shape
        q, kk, v = (
            t.reshape(b, k, self.n_heads, self.head_dim).transpose(1, 2)
            for t in self.qkv(tokens).chunk(3, dim=-1)
        )
        scores = q @ kk.transpose(-1, -2) / math.sqrt(self.head_dim)
        att = self.drop(scores.softmax(dim=-1)) @ v
        h = self.norm1(tokens + self.drop(self.out(att.transpose(1, 2).reshape(b, k, d))))
        return self.norm2(h + self.drop(self.ffn(h)))


class ChannelwiseGRU(Encoder):
    """Per-channel GRUs -> last valid states (+ static token) -> self-attention -> mean -> z."""

    name = "cwgru"

    def __init__(
        self,
        n_features: int,
        n_static: int = 0,
        *,
        hidden: int = 8,
        channels: Sequence[Sequence[int]] | None = None,
        n_heads: int = 2,
        dropout: float = 0.0,
    ) -> None:
        """`channels`: column-index groups, one GRU each (default: every column its own channel).

        The static token exists only when n_static > 0, so `uses_static` is n_static > 0.
        """
        super().__init__()
        groups = [list(g) for g in channels] if channels is not None else [
            [i] for i in range(n_features)
        ]
        cols = [c for g in groups for c in g]
        if not groups or any(not g for g in groups) or any(not 0 <= c < n_features for c in cols):
            raise ValueError(f"channels must be non-empty groups of columns in [0, {n_features})")
        self.n_features, self.n_static, self.hidden = n_features, n_static, hidden
        self.n_heads, self.dropout = n_heads, dropout
        self.channels = groups if channels is not None else None
        self.out_dim, self.uses_static = hidden, n_static > 0
        self._sizes = [len(g) for g in groups]
        # One gather puts every group's columns side by side; a split then feeds each GRU.
        order = torch.tensor(cols, dtype=torch.int64)
        self.register_buffer("column_order", order, persistent=False)
        self.grus = nn.ModuleList(nn.GRU(n, hidden, batch_first=True) for n in self._sizes)
        self.static_token = nn.Linear(n_static, hidden) if n_static > 0 else None
        self.attention = ChannelSelfAttention(hidden, n_heads, dropout)
        self.z_drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, lengths: Tensor, static: Tensor | None = None) -> Tensor:
        lengths = clamp_lengths(lengths, x.shape[1])
        parts = torch.split(x.index_select(2, self.column_order), self._sizes, dim=2)
        # A forward-only GRU's output at lengths-1 never saw the padding after it.
        states = torch.stack([gru(p)[0] for gru, p in zip(self.grus, parts, strict=True)], dim=2)
        tokens = last_valid(states, lengths)  # [B, K, hidden]
        if self.static_token is not None:
            if static is None:
                raise ValueError("this encoder was built with static features: pass `static`")
            tokens = torch.cat([tokens, self.static_token(static).unsqueeze(1)], dim=1)
        return self.z_drop(self.attention(tokens).mean(dim=1))

    def hparams(self) -> dict[str, Any]:
        return {
            "hidden": self.hidden,
            "channels": self.channels,
            "n_heads": self.n_heads,
            "dropout": self.dropout,
        }
