"""The encoder registry rebuilds encoders by name and names the valid ones on a typo."""

from __future__ import annotations

import json

import pytest

from scehr.training.encoders import (
    ENCODERS,
    TRAINABLE,
    BenchmarkLSTM,
    CausalSummaryLSTM,
    ChannelwiseGRU,
    EnsembleEncoder,
    SummaryLSTM,
    build_encoder,
)

#: Constructor arguments an encoder cannot default for 4 features (SummaryLSTM's channels; an
#: ensemble's member encoders).
NEEDS = {"sumlstm": {"widths": [1, 1]}, "causal_sumlstm": {"widths": [1, 1]},
         "ensemble": {"members": [{"name": "lstm", "hparams": {"units": 4}},
                                  {"name": "cwgru", "hparams": {}}]}}


def test_registry() -> None:
    assert {"lstm": BenchmarkLSTM, "cwgru": ChannelwiseGRU, "sumlstm": SummaryLSTM,
            "causal_sumlstm": CausalSummaryLSTM, "ensemble": EnsembleEncoder} == ENCODERS
    assert set(TRAINABLE) == set(ENCODERS) - {"ensemble"}  # an ensemble is combined, not trained
    for name, cls in ENCODERS.items():
        enc = build_encoder(name, 4, 2, **NEEDS.get(name, {}))
        assert isinstance(enc, cls) and enc.name == name
        json.dumps(enc.hparams())  # manifests store it as JSON


def test_unknown_name_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="causal_sumlstm, cwgru, ensemble, lstm, sumlstm"):
        build_encoder("transformer", 4)
