"""The one encoder interface, plus the length helpers every encoder shares.

Padded batches must give each stay the same z it gets alone, and the graph must export to
ONNX without packed sequences, so lengths are handled with plain gathers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import Tensor, nn


class Encoder(nn.Module, ABC):
    """Φ: x [B, T, F], lengths [B], static [B, S] | None -> z [B, out_dim]."""

    #: Registry name, recorded in manifests next to `hparams()`.
    name: str = ""
    out_dim: int
    uses_static: bool

    @abstractmethod
    def forward(self, x: Tensor, lengths: Tensor, static: Tensor | None = None) -> Tensor:
        """Encode padded stays; steps at or beyond a stay's length must not change its z."""

    @abstractmethod
    def hparams(self) -> dict[str, Any]:
        """JSON-serialisable constructor kwargs other than n_features and n_static.

        `build_encoder(name, n_features, n_static, **hparams())` rebuilds the same architecture,
        which is how checkpoints and manifests record an encoder.
        """


#: Encoder name -> its class: filled by the package (training/encoders/__init__.py), read by
#: `build_encoder`. Here, beside the interface, so that an encoder made of encoders (the
#: ensemble) builds its members without importing the package that registers it.
ENCODERS: dict[str, type[Encoder]] = {}


def build_encoder(name: str, n_features: int, n_static: int = 0, **hparams: Any) -> Encoder:
    """Build the encoder registered as `name`; `hparams` as returned by `Encoder.hparams()`."""
    if name not in ENCODERS:
        raise ValueError(f"unknown encoder {name!r}; valid names: {', '.join(sorted(ENCODERS))}")
    return ENCODERS[name](n_features, n_static, **hparams)


def clamp_lengths(lengths: Tensor, seq_len: int | Tensor) -> Tensor:
    """Lengths as int64 in [1, T]: an empty stay reads step 0 rather than indexing -1."""
    return lengths.to(torch.int64).clamp(min=1, max=seq_len)


def reversal_index(lengths: Tensor, seq_len: int | Tensor) -> Tensor:
    """[B, T] time index that reverses each stay's first `length` steps and keeps its padding.

    The map is its own inverse, so the same index un-reverses a backward RNN's outputs. A backward
    RNN fed `gather_steps(x, index)` starts at the stay's own last valid step and sees its padding
    only after every valid step. Build it once from the input's T: the dynamo exporter records
    an RNN output's T as the example's T, so shapes are never taken from RNN outputs.
    """
    steps = torch.arange(seq_len, device=lengths.device, dtype=torch.int64).unsqueeze(0)
    lens = lengths.unsqueeze(1)
    return torch.where(steps < lens, lens - 1 - steps, steps)


def gather_steps(h: Tensor, index: Tensor) -> Tensor:
    """h [B, T, H] re-ordered in time by index [B, T]."""
    return torch.gather(h, 1, index.unsqueeze(-1).expand(-1, -1, h.shape[-1]))


def last_valid(h: Tensor, lengths: Tensor) -> Tensor:
    """h [B, T, ...] at step lengths-1 of each stay -> [B, ...]."""
    index = (lengths - 1).view(-1, *([1] * (h.dim() - 1))).expand(-1, 1, *h.shape[2:])
    return torch.gather(h, 1, index).squeeze(1)


class LockedDropout(nn.Module):
    """Dropout with one mask per stay shared by all time steps (Keras LSTM `dropout`)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        mask = torch.empty_like(x[:, :1]).bernoulli_(1.0 - self.p) / (1.0 - self.p)
        return x * mask
