"""`sumlstm` made causal in time: z at every hour from the data up to that hour, in one run.

A landmark model gives the risk at hour h from the data of hours [0, h). Running the encoder once
per hour would cost T runs; instead every part of `SummaryLSTM` is made cumulative: a
unidirectional LSTM's output at step t has only seen steps <= t, and the summaries (last, min,
max, mean, count, time since the last observation) are running statistics up to each step. Step
t of `steps()` therefore equals `SummaryLSTM` (same weights) run on the stay cut at t + 1 steps,
which the tests check, and later values can never leak into an earlier hour.

Running min/max/last are cumulative maxima (ONNX has CumSum but no CumMax): each is the maximum
of a step and its shifts by 1, 2, 4, ... steps, log2(T) elementwise `Max`es over [B, T, C]; a
maximum over a [T, T] lower-triangular mask gives the same values at T times the work.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from scehr.training.encoders.base import clamp_lengths, last_valid
from scehr.training.encoders.summary_lstm import BIG, SummaryLSTM

#: Running maxima are exact up to this many steps: the shifts are fixed (the graph must not
#: depend on the traced example's length), 12 of them; a landmark window has 48 steps.
CUMMAX_STEPS = 4096


def cummax(a: Tensor) -> Tensor:
    """The running maximum of [B, T, C] along time: step t is max(a[:, :t + 1]). Exact (a
    maximum rounds nothing), in shifted maxima by 1, 2, 4, ... steps that ONNX exports as Pad,
    Slice and Max; a shift beyond T adds only padding, so any T up to `CUMMAX_STEPS` is exact."""
    t = a.shape[1]
    torch._check(t <= CUMMAX_STEPS, lambda: f"causal_sumlstm reads at most {CUMMAX_STEPS} steps")
    shift = 1
    while shift < CUMMAX_STEPS:
        a = torch.maximum(a, F.pad(a, (0, 0, shift, 0), value=-BIG)[:, :t])
        shift *= 2
    return a


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
        masks = (x[..., self.n_value:] > 0.5).to(x.dtype)  # [B, T, C]
        values = x[..., : self.n_value]
        seen = masks.index_select(2, self.value_mask - self.n_value)  # [B, T, n_value]
        count_v = torch.cumsum(seen, dim=1)
        any_v = (count_v > 0).to(x.dtype)
        mean = torch.cumsum(values * seen, dim=1) / count_v.clamp(min=1.0)
        observed = seen > 0
        vmax = cummax(torch.where(observed, values, torch.full_like(values, -BIG))) * any_v
        vmin = -cummax(torch.where(observed, -values, torch.full_like(values, -BIG))) * any_v
        pos = (steps.to(x.dtype) + 1.0).view(1, -1, 1)
        last_v = cummax(seen * pos)  # [B, T, n_value]: the last step seen, from 1; 0: none yet
        index = (last_v - 1.0).clamp(min=0.0).to(torch.int64)
        last = torch.gather(values, 1, index) * any_v
        count_c = torch.cumsum(masks, dim=1)
        last_c = cummax(masks * pos)
        length = pos
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
