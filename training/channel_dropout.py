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

from scehr.schemas.featureset import FeatureSet
from scehr.schemas.tensorize import Normalizer, Observations, discretize


def absent_row(fs: FeatureSet, normalizer: Normalizer) -> np.ndarray:
    """float32 [F]: one time step of a stay with no observation at all, normalised."""
    empty, _ = discretize(Observations([], [], [], [], 1), fs, float(fs.timestep))
    return normalizer.transform(empty[:, :1])[0, 0]


def column_owner(fs: FeatureSet) -> np.ndarray:
    """int64 [F]: the channel each column belongs to (value or one-hot columns, then masks)."""
    owner = np.empty(fs.n_features, dtype=np.int64)
    for c, cols in enumerate(fs.channel_columns):
        owner[cols] = c
    return owner


LABS = ("ph", "paco2", "pao2", "sao2", "hco3", "lactate", "glucose", "bun", "creatinine",
        "sodium", "potassium", "magnesium", "hematocrit", "wbc", "platelets", "albumin",
        "bilirubin", "alp", "alt", "ast", "cholesterol", "troponin_i", "troponin_t")
#: Channels a unit records or lacks together (a group keeps the ids its feature set has).
CHANNEL_GROUPS: dict[str, tuple[str, ...]] = {
    "GCS": ("gcs_total", "gcs_eye", "gcs_motor", "gcs_verbal"),
    "labs": LABS,
    "blood gases": ("ph", "paco2", "pao2", "sao2", "hco3", "lactate"),
    "invasive pressures": ("invasive_systolic_bp", "invasive_diastolic_bp", "invasive_mean_bp"),
    "ventilation, FiO2": ("mechanical_ventilation", "fio2"),
    "urine output": ("urine_output",),
}


def dropout_units(fs: FeatureSet, groups: bool) -> list[list[int]]:
    """What is dropped as one: every channel alone, and with `groups` also every non-empty
    group of CHANNEL_GROUPS."""
    units = [[c] for c in range(fs.n_channels)]
    if groups:
        ids = fs.variable_ids
        units += [idx for members in CHANNEL_GROUPS.values()
                  if len(idx := [ids.index(v) for v in members if v in ids]) > 1]
    return units


class ChannelDropout:
    """Drops each channel of each stay with probability `p` (a batch at a time); with `groups`
    also each channel group as a whole, with the same probability, since a site that lacks one
    lab usually lacks them all (independent drops of 23 labs almost never remove them all)."""

    def __init__(self, fs: FeatureSet, normalizer: Normalizer, p: float,
                 groups: bool = False) -> None:
        if not 0.0 <= p < 1.0:
            raise ValueError(f"channel_dropout must be in [0, 1), not {p!r}")
        self.p = p
        self.n_channels = fs.n_channels
        self.absent = torch.from_numpy(absent_row(fs, normalizer))
        self.owner = torch.from_numpy(column_owner(fs))
        units = dropout_units(fs, groups)
        member = np.zeros((len(units), fs.n_channels), dtype=np.float32)
        for u, chans in enumerate(units):
            member[u, chans] = 1.0
        self.member = torch.from_numpy(member)  # [U, C]

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
        drawn = torch.rand(x.shape[0], self.member.shape[0], generator=gen) < self.p
        dropped = (drawn.float() @ self.member) > 0  # [B, C]: any unit holding the channel
        return self.drop(x, lengths.to(x.device), dropped.to(x.device))
