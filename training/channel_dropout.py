"""Channel dropout: during training, whole channels of a stay are made absent at random.

A model trained on a site that records every channel learns nothing about stays where a
channel was never measured (GCS on a unit that does not chart it, labs in a small hospital),
and its risk drifts when it meets one. Dropping a channel here writes exactly what the
discretizer and normaliser write for a channel with no observation in the stay: its value
columns hold the normal value (normalised), its mask column 0, at every valid time step;
padding is left as it is. So a dropped channel is indistinguishable from an absent one, and
the service needs nothing new.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from schemas.featureset import FeatureSet
from schemas.tensorize import Normalizer, Observations, discretize


def absent_row(fs: FeatureSet, normalizer: Normalizer) -> np.ndarray:
    """float32 [F]: one time step of a stay with no observation at all, normalised."""
    empty, _ = discretize(Observations([], [], [], [], 1), fs, float(fs.timestep))
    return normalizer.transform(empty[:, :1])[0, 0]


def column_owner(fs: FeatureSet) -> np.ndarray:
    """int64 [F]: the channel each column belongs to (value or one-hot columns, then masks)."""
    owner = np.empty(fs.n_features, dtype=np.int64)
    for c, (b, w) in enumerate(zip(fs.begins, fs.widths, strict=True)):
        owner[int(b) : int(b + w)] = c
        owner[fs.n_value_columns + c] = c
    return owner


class ChannelDropout:
    """Drops each channel of each stay with probability `p` (a batch at a time)."""

    def __init__(self, fs: FeatureSet, normalizer: Normalizer, p: float) -> None:
        if not 0.0 <= p < 1.0:
            raise ValueError(f"channel_dropout must be in [0, 1), not {p!r}")
        self.p = p
        self.n_channels = fs.n_channels
        self.absent = torch.from_numpy(absent_row(fs, normalizer))
        self.owner = torch.from_numpy(column_owner(fs))

    def drop(self, x: Tensor, lengths: Tensor, dropped: Tensor) -> Tensor:
        """`x` [B, T, F] with the channels where `dropped` [B, C] is true made absent."""
        cols = dropped[:, self.owner.to(x.device)]  # [B, F]
        valid = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]
        where = cols[:, None, :] & valid[:, :, None]
        return torch.where(where, self.absent.to(x.device, x.dtype), x)

    def __call__(self, x: Tensor, lengths: Tensor, gen: torch.Generator) -> Tensor:
        """`x` with random channels absent; draws nothing (and changes nothing) when p = 0."""
        if self.p == 0.0:
            return x
        dropped = torch.rand(x.shape[0], self.n_channels, generator=gen) < self.p
        return self.drop(x, lengths.to(x.device), dropped.to(x.device))
