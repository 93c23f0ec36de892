"""Encoders Φ and the registry that rebuilds them by name from a manifest or checkpoint."""

from __future__ import annotations

from scehr.training.encoders.base import ENCODERS, Encoder, build_encoder
from scehr.training.encoders.causal_summary_lstm import CausalSummaryLSTM
from scehr.training.encoders.channelwise_gru import ChannelwiseGRU
from scehr.training.encoders.ensemble import EnsembleEncoder
from scehr.training.encoders.lstm import BenchmarkLSTM
from scehr.training.encoders.summary_lstm import SummaryLSTM

ENCODERS.update({
    "lstm": BenchmarkLSTM, "cwgru": ChannelwiseGRU, "sumlstm": SummaryLSTM,
    "causal_sumlstm": CausalSummaryLSTM, "ensemble": EnsembleEncoder})
#: Encoders a run can train; an ensemble is combined from trained runs (training.ensemble).
TRAINABLE = tuple(sorted(set(ENCODERS) - {"ensemble"}))


__all__ = ["ENCODERS", "TRAINABLE", "BenchmarkLSTM", "CausalSummaryLSTM", "ChannelwiseGRU",
           "Encoder", "EnsembleEncoder", "SummaryLSTM", "build_encoder"]
