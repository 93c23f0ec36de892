"""`sumlstm` made causal in time: z at every hour from the data up to that hour, in one run.

A landmark model gives the risk at hour h from the data of hours [0, h). Running the encoder once
per hour would cost T runs; instead every part of `SummaryLSTM` is made cumulative: a
unidirectional LSTM's output at step t has only seen steps <= t, and the summaries (last, min,
max, mean, count, time since the last observation) are running statistics up to each step. Step
t of `steps()` therefore equals `SummaryLSTM` (same weights) run on the stay cut at t + 1 steps,
which the tests check, and later values can never leak into an earlier hour.

Running min/max/last are maxima over a [T, T] lower-triangular mask rather than a cumulative max
(ONNX has CumSum but no CumMax); T is at most the window's 48 steps, so the mask stays small.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from scehr.training.encoders.base import clamp_lengths, last_valid
from scehr.training.encoders.summary_lstm import BIG, SummaryLSTM


class CausalSummaryLSTM(SummaryLSTM):
    """SummaryLSTM whose z at step t depends on steps <= t only; `steps()` gives every step's z.
    """

    name = "causal_sumlstm"

    def __init__(self, n_features: int, n_static: int = 0, **hparams: Any) -> None:
        if hparams.get("bidirectional"):
            raise ValueError("causal_sumlstm reads each hour's past only: bidirectional must be "
                             "false")
        super().__init__(n_features, n_static, **{**hparams, "bidirectional": False})

    def running_summaries(self, x: Tensor) -> Tensor:
        """[B, T, 4·n_value + 2·n_channels]: step t holds `summaries(x, lengths=t + 1)`."""
        t = x.shape[1]
        steps = torch.arange(t, device=x.device, dtype=torch.int64)
        upto = (steps.unsqueeze(0) <= steps.unsqueeze(1)).to(x.dtype)  # [T query, T key]
        masks = (x[..., self.n_value:] > 0.5).to(x.dtype)  # [B, T, C]
        values = x[..., : self.n_value]
        seen = masks.index_select(2, self.value_mask - self.n_value)  # [B, T, n_value]
        count_v = torch.cumsum(seen, dim=1)
        any_v = (count_v > 0).to(x.dtype)
        mean = torch.cumsum(values * seen, dim=1) / count_v.clamp(min=1.0)
        # [B, T query, T key, n_value]: seen at a key step no later than the query step
        seen_upto = seen.unsqueeze(1) * upto.view(1, t, t, 1)
        wide = values.unsqueeze(1)
        vmax = torch.where(seen_upto > 0, wide, torch.full_like(wide, -BIG)).amax(dim=2) * any_v
        vmin = torch.where(seen_upto > 0, wide, torch.full_like(wide, BIG)).amin(dim=2) * any_v
        pos = steps.to(x.dtype) + 1.0
        last_v = (seen_upto * pos.view(1, 1, -1, 1)).amax(dim=2)  # [B, T, n_value]
        index = (last_v - 1.0).clamp(min=0.0).to(torch.int64)
        last = torch.gather(values, 1, index) * any_v
        count_c = torch.cumsum(masks, dim=1)
        last_c = (masks.unsqueeze(1) * upto.view(1, t, t, 1) * pos.view(1, 1, -1, 1)).amax(dim=2)
        length = pos.view(1, -1, 1)
        since = torch.where(count_c > 0, (length - last_c) / length, torch.ones_like(count_c))
        return torch.cat([last, vmin, vmax, mean, torch.log1p(count_c), since], dim=2)

    def steps(self, x: Tensor, lengths: Tensor, static: Tensor | None = None) -> Tensor:
        """z at every step [B, T, out_dim]; steps at or beyond a stay's length are undefined."""
        lengths = clamp_lengths(lengths, x.shape[1])
        h = self.rnn.z_drop(self.rnn.sequence(x, lengths, static))
        s = self.running_summaries(x)
        if self.uses_static:
            assert static is not None  # the LSTM above has already refused a missing one
            s = torch.cat([s, static.unsqueeze(1).expand(-1, x.shape[1], -1)], dim=2)
        return torch.cat([h, self.summary(s)], dim=2)

    def forward(self, x: Tensor, lengths: Tensor, static: Tensor | None = None) -> Tensor:
        return last_valid(self.steps(x, lengths, static), clamp_lengths(lengths, x.shape[1]))
