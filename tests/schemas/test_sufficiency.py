"""The data-sufficiency rule: what counts as data, and reasons that name what is missing."""

from __future__ import annotations

import numpy as np

from scehr.schemas.featureset import FEATURE_SETS
from scehr.schemas.sufficiency import DataMinimum, shortfalls, summarize, summarize_by_hour
from scehr.schemas.tensorize import Observations

FS = FEATURE_SETS["physionet2012-full"]
MIN = DataMinimum(min_observations=100, min_channels=20, min_hours_covered=24,
                  max_hours_since_last=24, rule="test")


def ch(vid: str) -> int:
    return FS.variable_ids.index(vid)


def stays(rows: list[tuple[int, str, float]], n: int) -> Observations:
    return Observations(np.array([r[0] for r in rows]), np.array([ch(r[1]) for r in rows]),
                        np.array([r[2] for r in rows], dtype=float), np.ones(len(rows)), n)


def test_one_heart_rate_value_falls_short_with_reasons_naming_what_is_missing() -> None:
    [s] = summarize(stays([(0, "heart_rate", 3.0)], 1), np.array([48.0]), FS)
    assert (s.observations, s.channels, s.hours_covered) == (1, 1, 0.0)
    why = shortfalls(s, MIN)
    assert any("1 observation(s) inside the window" in w and "at least 100" in w for w in why)
    assert any("1 variable(s)" in w and "20" in w for w in why)
    assert any("span 0.0 h" in w for w in why)


def test_observations_outside_the_window_and_descriptors_are_no_data() -> None:
    rows = [(0, "heart_rate", 70.0), (0, "icu_type", 0.0), (0, "height", 0.0)]
    [s] = summarize(stays(rows, 1), np.array([48.0]), FS)
    assert s.observations == 0 and s.hours_since_last is None
    assert "0 observation(s) inside the window" in shortfalls(s, MIN)[0]


def test_a_stay_meeting_every_bound_has_no_shortfall_and_stays_are_independent() -> None:
    chans = [v for v in FS.variable_ids if v not in ("icu_type", "height")][:20]
    rows = [(1, chans[i % 20], float(t)) for i, t in enumerate(np.linspace(0, 47, 120))]
    rows.append((0, "heart_rate", 47.0))
    a, b = summarize(stays(rows, 2), np.array([48.0, 48.0]), FS)
    assert shortfalls(b, MIN) == []
    assert (b.observations, b.channels) == (120, 20)
    assert a.observations == 1 and abs(a.hours_since_last - 1.0) < 1e-9
    stale = DataMinimum(min_observations=1, min_channels=1, max_hours_since_last=0.5, rule="t")
    assert "1.0 h before the window's end" in shortfalls(a, stale)[0]


def test_one_stay_alone_is_summarized_as_in_a_batch() -> None:
    """The single-stay path (a served request) gives the batch path's figures, bit for bit:
    times at the window's edges, negative zero, descriptors, an empty stay."""
    rng = np.random.default_rng(3)
    n = 30
    k = 2000
    st = rng.integers(0, n, k)
    chans = rng.integers(0, FS.n_channels, k)
    t = rng.choice([-1e-7, -0.0, 0.0, 1e-7, 47.9999995, 48.0, 48.000002, 60.0,
                    *rng.uniform(0, 48, 20)], k)
    keep = st != 7  # stay 7 has no observations
    obs = Observations(st[keep], chans[keep], t[keep], np.ones(keep.sum()), n)
    end = rng.choice([48.0, 24.0, 0.5], n)
    batch = summarize(obs, end, FS)
    for i in range(n):
        rows = obs.stay == i
        alone = Observations(np.zeros(rows.sum(), dtype=np.int64), obs.channel[rows],
                             obs.time[rows], obs.value[rows], 1)
        assert repr(summarize(alone, end[i : i + 1], FS)) == repr([batch[i]]), i  # signs too


def test_by_hour_is_the_summary_of_the_window_ending_at_each_hour() -> None:
    """`summarize_by_hour` (a landmark model's minimum at every hour) gives `summarize`'s
    figures with the window ending at that hour: edges, descriptors, other stays, no data."""
    rng = np.random.default_rng(5)
    k = 600
    st = rng.integers(0, 3, k)
    chans = rng.integers(0, FS.n_channels, k)
    t = rng.choice([-1e-7, 0.0, 6.0, 6.0000005, 12.0, *rng.uniform(0, 48, 30)], k)
    obs = Observations(st, chans, t, np.ones(k), 3)
    hours = np.arange(1, 49)
    for stay in range(3):
        rows = obs.stay == stay
        alone = Observations(np.zeros(rows.sum(), dtype=np.int64), obs.channel[rows],
                             obs.time[rows], obs.value[rows], 1)
        expected = [summarize(alone, np.array([float(h)]), FS)[0] for h in hours]
        assert summarize_by_hour(obs, stay, hours, FS) == expected
    empty = Observations(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0),
                         np.zeros(0), 1)
    assert summarize_by_hour(empty, 0, np.array([1, 2]), FS) == [
        summarize(empty, np.array([1.0]), FS)[0]] * 2
