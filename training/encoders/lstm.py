"""The mimic3-benchmarks LSTM exactly as the SCEHR paper used it.

The Keras original (`mimic3models/keras_models/lstm.py`) stacks depth-1 layers of units/2 per
direction when bidirectional, then one final unidirectional LSTM of `units`; `dropout` drops each
LSTM's inputs (one mask per sequence) and then z. Its "depth 2" is therefore a BiLSTM of 8+8 units
followed by a 16-unit LSTM, not `nn.LSTM(num_layers=2)`. Keras' weight initialisation is kept too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from scehr.schemas.tasks import task_spec
from scehr.training.encoders.base import (
    Encoder,
    LockedDropout,
    clamp_lengths,
    gather_steps,
    last_valid,
    reversal_index,
)


def keras_init(lstm: nn.LSTM) -> nn.LSTM:
    """Keras LSTM defaults (glorot kernel, orthogonal recurrent, forget bias 1), as trained there.

    PyTorch's uniform(±1/√units) start differs; matching Keras keeps the paper's setting.
    """
    for name, param in lstm.named_parameters():
        if name.startswith("weight_ih"):
            nn.init.xavier_uniform_(param)
        elif name.startswith("weight_hh"):
            nn.init.orthogonal_(param)
        else:
            nn.init.zeros_(param)
            if name.startswith("bias_ih"):  # gate order i, f, g, o: the forget gate is block 1
                param.data[lstm.hidden_size : 2 * lstm.hidden_size] = 1.0
    return lstm


class _BiLayer(nn.Module):
    """Forward + backward LSTM where the backward one starts at each stay's last valid step.

    Two unidirectional LSTMs instead of `bidirectional=True`: nn.LSTM's own backward direction
    would start at the padded end, and packed sequences do not export to ONNX.
    """

    def __init__(self, n_in: int, units: int) -> None:
        super().__init__()
        self.fwd = keras_init(nn.LSTM(n_in, units, batch_first=True))
        self.bwd = keras_init(nn.LSTM(n_in, units, batch_first=True))

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        index = reversal_index(lengths, x.shape[1])
        out_f, _ = self.fwd(x)
        out_b, _ = self.bwd(gather_steps(x, index))
        return torch.cat([out_f, gather_steps(out_b, index)], dim=-1)


class BenchmarkLSTM(Encoder):
    """(Bi)LSTM stack -> last valid step of the final layer -> dropout -> z [B, units]."""

    name = "lstm"

    def __init__(
        self,
        n_features: int,
        n_static: int = 0,
        *,
        units: int = 16,
        depth: int = 2,
        bidirectional: bool = True,
        dropout: float = 0.3,
        static: bool = False,
    ) -> None:
        super().__init__()
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        if bidirectional and depth > 1 and units % 2:
            raise ValueError(f"bidirectional layers split units in two; units={units} is odd")
        self.n_features, self.units, self.depth = n_features, units, depth
        self.bidirectional, self.dropout = bidirectional, dropout
        # The paper's LSTM sees no demographics; `static=True` appends them to every time step.
        self.uses_static = bool(static and n_static > 0)
        self.n_static, self.out_dim = (n_static if self.uses_static else 0), units
        self.in_drop = nn.ModuleList(LockedDropout(dropout) for _ in range(depth))
        self.inner = nn.ModuleList()
        n_in = n_features + self.n_static
        for _ in range(depth - 1):
            if bidirectional:
                self.inner.append(_BiLayer(n_in, units // 2))
            else:
                self.inner.append(keras_init(nn.LSTM(n_in, units, batch_first=True)))
            n_in = units
        self.final = keras_init(nn.LSTM(n_in, units, batch_first=True))
        self.z_drop = nn.Dropout(dropout)

    @classmethod
    def for_task(cls, task: str, n_features: int) -> BenchmarkLSTM:
        """The paper's configuration for a task (its `TaskSpec.encoder_presets`)."""
        return cls(n_features, **task_spec(task).encoder_presets[cls.name])

    def forward(self, x: Tensor, lengths: Tensor, static: Tensor | None = None) -> Tensor:
        lengths = clamp_lengths(lengths, x.shape[1])
        return self.z_drop(last_valid(self.sequence(x, lengths, static), lengths))

    def sequence(self, x: Tensor, lengths: Tensor, static: Tensor | None = None) -> Tensor:
        """The final layer's output at every step [B, T, units] (before z's dropout); causal in
        time when the stack is unidirectional."""
        h = x
        if self.uses_static:
            if static is None:
                raise ValueError("this encoder was built with static=True: pass `static`")
            h = torch.cat([x, static.unsqueeze(1).expand(-1, x.shape[1], -1)], dim=-1)
        for drop, layer in zip(self.in_drop, self.inner, strict=False):
            h = layer(drop(h), lengths) if isinstance(layer, _BiLayer) else layer(drop(h))[0]
        out, _ = self.final(self.in_drop[-1](h))
        return out

    def hparams(self) -> dict[str, Any]:
        return {
            "units": self.units,
            "depth": self.depth,
            "bidirectional": self.bidirectional,
            "dropout": self.dropout,
            "static": self.uses_static,
        }
