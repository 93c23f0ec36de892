"""The benchmark LSTM's state concatenated with masked summary statistics of every channel.

A recurrent state forgets; a logistic regression on per-variable summaries (last, min, max,
mean, count, time since last observation) beats it on PhysioNet 2012. This encoder gives the
anchor head both: z = [LSTM state ; MLP(summaries (+ demographics))]. The summaries are
computed inside the graph from the input's own mask columns, so the ONNX model needs nothing
beyond `x`, `lengths` and `static`, and steps at or beyond a stay's length never count.

Layout of x (schemas.featureset.FeatureSet): each channel's value columns (one-hot columns for a
categorical channel, one column for a continuous one), then one mask column per channel. The
encoder therefore needs each channel's width; by default it takes them from the registered
feature sets with this many features (all of them must agree), and records them in `hparams()`
so a checkpoint or manifest rebuilds the same graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from scehr.training.encoders.base import Encoder, clamp_lengths
from scehr.training.encoders.lstm import BenchmarkLSTM

#: Statistics per value column (last, min, max, mean over observed steps) and per channel
#: (log(1 + count), time since the last observation as a share of the stay).
VALUE_STATS, CHANNEL_STATS = 4, 2
#: Stands in for ±infinity in the masked min/max (finite, so ONNX and float32 stay exact).
BIG = 1e4


def feature_set_widths(n_features: int) -> list[int]:
    """Channel widths of the registered feature sets with `n_features` columns (all must agree).
    """
    from scehr.schemas.featureset import FEATURE_SETS

    found = {tuple(int(w) for w in fs.widths) for fs in FEATURE_SETS.values()
             if fs.n_features == n_features}
    if len(found) != 1:
        raise ValueError(f"no single registered feature set has {n_features} features "
                         f"({len(found)} layouts do): pass the channel `widths` explicitly")
    return list(found.pop())


class SummaryLSTM(Encoder):
    """z = [BenchmarkLSTM(x) ; ReLU(Linear([summaries(x) ; static]))], size units + summary_dim."""

    name = "sumlstm"

    def __init__(
        self,
        n_features: int,
        n_static: int = 0,
        *,
        units: int = 32,
        depth: int = 1,
        bidirectional: bool = False,
        dropout: float = 0.3,
        static: bool = True,
        summary_dim: int = 32,
        widths: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        widths = list(widths) if widths is not None else feature_set_widths(n_features)
        n_value = sum(widths)
        if n_value + len(widths) != n_features or min(widths, default=0) < 1:
            raise ValueError(f"widths {widths} do not describe {n_features} columns (value "
                             "columns plus one mask column per channel)")
        self.widths, self.summary_dim = widths, summary_dim
        self.rnn = BenchmarkLSTM(n_features, n_static, units=units, depth=depth,
                                 bidirectional=bidirectional, dropout=dropout, static=static)
        self.uses_static = self.rnn.uses_static
        self.n_static = self.rnn.n_static
        channel = torch.repeat_interleave(torch.arange(len(widths)), torch.tensor(widths))
        # The mask column of each value column's channel.
        self.register_buffer("value_mask", (n_value + channel).to(torch.int64), persistent=False)
        self.n_value, self.n_channels = n_value, len(widths)
        n_summary = VALUE_STATS * n_value + CHANNEL_STATS * len(widths) + self.n_static
        self.summary = nn.Sequential(nn.Dropout(dropout), nn.Linear(n_summary, summary_dim),
                                     nn.ReLU())
        self.out_dim = units + summary_dim

    def summaries(self, x: Tensor, lengths: Tensor) -> Tensor:
        """[B, 4·n_value + 2·n_channels] masked statistics of the first `lengths` steps."""
        t = x.shape[1]
        steps = torch.arange(t, device=x.device, dtype=torch.int64)
        valid = (steps.unsqueeze(0) < lengths.unsqueeze(1)).unsqueeze(-1)  # [B, T, 1]
        # [B, T, C] observed (mask column set) and inside the stay, as 0/1
        masks = ((x[..., self.n_value:] > 0.5) & valid).to(x.dtype)
        values = x[..., : self.n_value]
        seen = masks.index_select(2, self.value_mask - self.n_value)  # [B, T, n_value]
        count_v = seen.sum(dim=1)
        any_v = (count_v > 0).to(x.dtype)
        mean = (values * seen).sum(dim=1) / count_v.clamp(min=1.0)
        vmax = torch.where(seen > 0, values, torch.full_like(values, -BIG)).amax(dim=1) * any_v
        vmin = torch.where(seen > 0, values, torch.full_like(values, BIG)).amin(dim=1) * any_v
        # The last observed step: the largest (step + 1) · mask, 0 when never observed.
        pos = (steps.to(x.dtype) + 1.0).view(1, -1, 1)
        last_v = (seen * pos).amax(dim=1)  # [B, n_value]
        index = (last_v - 1.0).clamp(min=0.0).to(torch.int64).unsqueeze(1)
        last = torch.gather(values, 1, index).squeeze(1) * any_v
        count_c = masks.sum(dim=1)
        last_c = (masks * pos).amax(dim=1)
        length = lengths.to(x.dtype).unsqueeze(1)
        since = torch.where(count_c > 0, (length - last_c) / length, torch.ones_like(count_c))
        return torch.cat([last, vmin, vmax, mean, torch.log1p(count_c), since], dim=1)

    def forward(self, x: Tensor, lengths: Tensor, static: Tensor | None = None) -> Tensor:
        lengths = clamp_lengths(lengths, x.shape[1])
        h = self.rnn(x, lengths, static)
        s = self.summaries(x, lengths)
        if self.uses_static:
            assert static is not None  # the LSTM above has already refused a missing one
            s = torch.cat([s, static], dim=1)
        return torch.cat([h, self.summary(s)], dim=1)

    def hparams(self) -> dict[str, Any]:
        rnn = self.rnn.hparams()
        return {**rnn, "summary_dim": self.summary_dim, "widths": list(self.widths)}
