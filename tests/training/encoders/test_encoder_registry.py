"""The encoder registry rebuilds encoders by name and names the valid ones on a typo."""

from __future__ import annotations

import json

import pytest

from training.encoders import ENCODERS, BenchmarkLSTM, ChannelwiseGRU, build_encoder


def test_registry() -> None:
    assert {"lstm": BenchmarkLSTM, "cwgru": ChannelwiseGRU} == ENCODERS
    for name, cls in ENCODERS.items():
        enc = build_encoder(name, 4, 2)
        assert isinstance(enc, cls) and enc.name == name
        json.dumps(enc.hparams())  # manifests store it as JSON


def test_unknown_name_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="cwgru, lstm"):
        build_encoder("transformer", 4)
