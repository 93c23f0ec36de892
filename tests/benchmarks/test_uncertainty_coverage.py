"""The coverage benchmark reads the served sets as the service does and brackets its figures."""

from __future__ import annotations

import numpy as np

from benchmarks.uncertainty_coverage import coverage_row
from scehr.schemas.uncertainty import RiskUncertainty
from tests.service.fixture_model import UNCERTAINTY_CARD


def test_coverage_row_counts_the_true_outcome_in_its_set() -> None:
    u = RiskUncertainty.model_validate(UNCERTAINTY_CARD)  # outcome from 0.3, none up to 0.6
    y = np.array([1, 1, 1, 0, 0, 0, 0, 0], dtype=float)
    r = np.array([0.9, 0.4, 0.1, 0.1, 0.5, 0.7, 0.2, 0.65])
    row = coverage_row(u, y, r, n_boot=50)
    assert row["coverage_with_outcome"] == 2 / 3 and row["coverage_without_outcome"] == 3 / 5
    assert row["coverage"] == 5 / 8 and row["n"] == 8 and row["positives"] == 3
    assert row["coverage_ci"][0] <= row["coverage"] <= row["coverage_ci"][1]
    assert row["level"] == 0.9 and 0.0 <= row["single_outcome"] <= 1.0
