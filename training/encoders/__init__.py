"""Encoders Φ and the registry that rebuilds them by name from a manifest or checkpoint."""

from __future__ import annotations

from typing import Any

from training.encoders.base import Encoder
from training.encoders.channelwise_gru import ChannelwiseGRU
from training.encoders.ensemble import EnsembleEncoder
from training.encoders.lstm import BenchmarkLSTM
from training.encoders.summary_lstm import SummaryLSTM

ENCODERS: dict[str, type[Encoder]] = {
    "lstm": BenchmarkLSTM, "cwgru": ChannelwiseGRU, "sumlstm": SummaryLSTM,
    "ensemble": EnsembleEncoder}
#: Encoders a run can train; an ensemble is combined from trained runs (training.ensemble).
TRAINABLE = tuple(sorted(set(ENCODERS) - {"ensemble"}))


def build_encoder(name: str, n_features: int, n_static: int = 0, **hparams: Any) -> Encoder:
    """Build the encoder registered as `name`; `hparams` as returned by `Encoder.hparams()`."""
    if name not in ENCODERS:
        raise ValueError(f"unknown encoder {name!r}; valid names: {', '.join(sorted(ENCODERS))}")
    return ENCODERS[name](n_features, n_static, **hparams)


__all__ = ["ENCODERS", "TRAINABLE", "BenchmarkLSTM", "ChannelwiseGRU", "Encoder",
           "EnsembleEncoder", "SummaryLSTM", "build_encoder"]
