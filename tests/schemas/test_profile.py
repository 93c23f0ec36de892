"""Value counts of the input profile: the vectorised counting equals one variable at a time."""

from __future__ import annotations

import numpy as np
import pytest

from scehr.schemas.featureset import BENCHMARK_48H, BENCHMARK_STAY, FeatureSet
from scehr.schemas.profile import Bins, value_counts
from scehr.schemas.tensorize import discretize
from tests.oracles.profile_counts import value_counts_by_variable
from tests.schemas.test_tensorize import random_obs


def _bins(fs: FeatureSet, rng: np.random.Generator) -> Bins:
    """Cut points at values the stays really hold (ties on a cut), some variables without."""
    edges = {}
    for v in fs.variables:
        if not v.is_categorical and rng.random() < 0.8:
            edges[v.id] = np.unique(np.round(rng.normal(80, 25, int(rng.integers(1, 10))))
                                    ).tolist()
    return Bins.of(fs, edges)


@pytest.mark.parametrize("fs", [BENCHMARK_48H, BENCHMARK_STAY], ids=lambda f: f.name)
@pytest.mark.parametrize("seed", [0, 1])
def test_value_counts_equal_the_per_variable_oracle(fs: FeatureSet, seed: int) -> None:
    rng = np.random.default_rng(seed)
    obs = random_obs(rng, 30, 80)
    obs.value[~np.array([fs.variables[c].is_categorical for c in obs.channel])] = np.round(
        obs.value[~np.array([fs.variables[c].is_categorical for c in obs.channel])])
    end = rng.choice([48.0, 30.0, 5.5], size=30)
    x, lengths = discretize(obs, fs, end)
    bins = _bins(fs, rng)
    got = value_counts(x, lengths, fs, bins)
    want = value_counts_by_variable(x, lengths, fs, bins)
    assert got.dtype == want.dtype == np.int32 and want.sum() > 500
    np.testing.assert_array_equal(got, want)
    one = value_counts(x[:1, : lengths[0]], lengths[:1], fs, bins)  # a single served stay
    np.testing.assert_array_equal(one, want[:1])
