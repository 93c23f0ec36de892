"""The benchmarks' synthetic stays are accepted by every feature set (else they time 422s)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from scehr.schemas.featureset import FEATURE_SETS
from scehr.schemas.ingest import ingest_stay
from scehr.schemas.payloads import StayPayload

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from common import full_stay


@pytest.mark.parametrize("name", sorted(FEATURE_SETS))
def test_synthetic_stays_are_clean_in_every_feature_set(name: str) -> None:
    fs = FEATURE_SETS[name]
    for seed in range(10):
        out = ingest_stay(StayPayload.model_validate(full_stay(seed, 48, fs)), fs)
        assert out.problems == [], out.problems[:2]
        changed = {n.code for n in out.notices} & {"value_implausible", "value_dropped",
                                                   "value_clipped", "value_rescaled"}
        assert not changed, (name, seed, changed)
        assert len(out.channel) >= 48  # a full stay, not a handful of rows
