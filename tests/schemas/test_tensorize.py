"""Discretizer parity: hand-computed stays and a randomized comparison with the row oracle."""

from __future__ import annotations

import numpy as np
import pytest

from scehr.schemas.featureset import BENCHMARK_48H, BENCHMARK_STAY, FEATURE_SETS
from scehr.schemas.tensorize import (
    Normalizer,
    Observations,
    apply_rules,
    clean,
    cleaning_masks,
    coverage,
    discretize,
    plausibility_masks,
)
from scehr.schemas.variables import BY_ID
from tests.oracles.discretizer import discretize_rows

FS = BENCHMARK_48H
CH = {v.id: i for i, v in enumerate(FS.variables)}
MASK0 = FS.n_value_columns


def col(var: str) -> int:
    return int(FS.begins[CH[var]])


def mask(var: str) -> int:
    return MASK0 + CH[var]


def obs(rows: list[tuple[int, str, float, float]], n: int) -> Observations:
    return Observations(
        [r[0] for r in rows], [CH[r[1]] for r in rows], [r[2] for r in rows],
        [r[3] for r in rows], n,
    )


def test_layout_is_the_benchmark_76() -> None:
    assert FS.n_features == 76 and FS.n_value_columns == 59
    assert len(FS.continuous_columns) == 12
    assert FS.column_names()[col("gcs_total")] == "gcs_total=11"


def test_bins_edges_last_value_wins_and_window() -> None:
    x, lengths = discretize(obs([
        (0, "heart_rate", 0.0, 70.0),    # t = 0 -> bin 0
        (0, "heart_rate", 1.0, 80.0),    # exactly on the hour -> still bin 0, and later: wins
        (0, "heart_rate", 1.0001, 90.0),  # just after the hour -> bin 1
        (0, "heart_rate", 47.5, 95.0),   # last bin
        (0, "heart_rate", 48.0, 99.0),   # exactly the window end -> bin 47, wins over 95
        (0, "heart_rate", 48.5, 120.0),  # after the window -> ignored
    ], 1), FS)
    hr = x[0, :, col("heart_rate")]
    assert lengths.tolist() == [48] and x.shape == (1, 48, 76)
    assert hr[0] == 80.0 and hr[1] == 90.0 and hr[2] == 90.0  # forward fill
    assert hr[46] == 90.0 and hr[47] == 99.0
    m = x[0, :, mask("heart_rate")]
    assert m[0] == 1 and m[1] == 1 and m[2] == 0 and m[47] == 1


def test_last_value_in_bin_wins_in_time_order_not_input_order() -> None:
    x, _ = discretize(obs([(0, "ph", 0.9, 7.1), (0, "ph", 0.2, 7.3)], 1), FS)
    assert x[0, 0, col("ph")] == pytest.approx(7.1)


def test_normal_value_before_first_observation_and_never_observed() -> None:
    x, _ = discretize(obs([(0, "glucose", 10.5, 200.0)], 1), FS)
    g = x[0, :, col("glucose")]
    assert (g[:10] == 128.0).all() and (g[10:] == 200.0).all()
    assert (x[0, :, col("temperature")] == np.float32(36.6)).all()
    assert (x[0, :, mask("temperature")] == 0).all()


def test_categorical_one_hot_order_and_imputation() -> None:
    eye = BY_ID["gcs_eye"]
    spont = eye.categories.index("4 Spontaneously")
    pain = eye.category_index(2)  # alias -> "2 To pain"
    assert eye.categories[pain] == "2 To pain"
    x, _ = discretize(obs([(0, "gcs_eye", 5.0, float(pain))], 1), FS)
    block = x[0, :, col("gcs_eye") : col("gcs_eye") + len(eye.categories)]
    assert (block.sum(axis=1) == 1).all()
    assert block[0, spont] == 1 and block[3, spont] == 1  # normal value before
    assert block[4, pain] == 1 and block[47, pain] == 1  # t = 5.0 -> bin 4, then carried


def test_stay_shorter_than_window_is_carried_forward() -> None:
    x, lengths = discretize(obs([(0, "respiratory_rate", 3.0, 22.0)], 1), FS)
    assert lengths[0] == 48 and x[0, 47, col("respiratory_rate")] == 22.0
    assert x[0, 3:, mask("respiratory_rate")].sum() == 0


def test_stays_are_independent_and_variable_length_for_phenotypes() -> None:
    rows = [(0, "heart_rate", 2.5, 100.0), (1, "heart_rate", 0.5, 60.0)]
    o = obs(rows, 2)
    x, lengths = discretize(o, BENCHMARK_STAY, np.array([10.0, 3.2]))
    assert lengths.tolist() == [10, 4] and x.shape[1] == 10
    assert x[1, 3, col("heart_rate")] == 60.0 and (x[1, 4:] == 0).all()
    assert x[0, 0, col("heart_rate")] == 86.0 and x[0, 2, col("heart_rate")] == 100.0


def random_obs(rng: np.random.Generator, n_stays: int, per_stay: int) -> Observations:
    n = n_stays * per_stay
    ch = rng.integers(0, FS.n_channels, n)
    val = rng.normal(80, 20, n)
    for i, v in enumerate(FS.variables):
        if v.is_categorical:
            sel = ch == i
            val[sel] = rng.integers(0, len(v.categories), sel.sum())
    t = np.round(rng.uniform(-0.5, 52, n) * 2) / 2  # many exact half-hours and hours
    return Observations(rng.integers(0, n_stays, n), ch, t, val, n_stays)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n_stays", [40, 100])  # forward fill: one accumulate / one op per bin
@pytest.mark.parametrize("in_order", [False, True])  # given as a reader gives them, or shuffled
def test_equals_row_oracle_on_random_stays(seed: int, n_stays: int, in_order: bool) -> None:
    rng = np.random.default_rng(seed)
    o = random_obs(rng, n_stays, 60)
    if in_order:  # (stay, time) order, equal times in their given order: the no-sort path
        o = o.take(np.lexsort((o.time, o.stay)))
    end = rng.choice([48.0, 47.5, 10.0, 0.5], size=n_stays)
    x, _ = discretize(o, BENCHMARK_STAY, end)
    ref = discretize_rows(o, BENCHMARK_STAY, end)
    np.testing.assert_array_equal(x, ref)


@pytest.mark.parametrize("in_order", [False, True])
def test_one_stay_alone_equals_the_row_oracle(in_order: bool) -> None:
    """A served request is one stay: its own order check and sort give the oracle's rows."""
    rng = np.random.default_rng(11)
    for _ in range(30):
        o = random_obs(rng, 1, int(rng.integers(0, 120)))
        if in_order:
            o = o.take(np.argsort(o.time, kind="stable"))
        end = rng.choice([48.0, 47.5, 10.0, 0.5], size=1)
        x, _ = discretize(o, BENCHMARK_STAY, end)
        np.testing.assert_array_equal(x, discretize_rows(o, BENCHMARK_STAY, end))


def test_cleaning_drops_and_clips_by_benchmark_ranges() -> None:
    o = obs([
        (0, "temperature", 1.0, -17.8),  # below outlier low 14.2 -> dropped
        (0, "temperature", 2.0, 20.0),   # between outlier low and valid low 26 -> 26
        (0, "ph", 3.0, 11.0),            # above outlier high 10 (and not pH) -> implausible
        (0, "heart_rate", 4.0, 0.1),     # above the plausible 0, below valid -> kept as is
        (0, "glucose", 5.0, 2500.0),     # plausible, above outlier high 2200 -> dropped
    ], 1)
    kept, rep = clean(o, FS)
    assert len(kept) == 2 and kept.value.tolist() == [26.0, 0.1]
    assert rep.dropped[CH["temperature"]] == 1 and rep.dropped[CH["glucose"]] == 1
    assert rep.clipped[CH["temperature"]] == 1 and rep.dropped_rows.tolist() == [0, 4]
    assert rep.implausible_rows.tolist() == [2] and rep.removed_rows.tolist() == [0, 2, 4]


def test_plausibility_removes_artefacts_and_undoes_a_known_scaling() -> None:
    o = obs([
        (0, "heart_rate", 1.0, 0.0),        # a zero heart rate: an artefact
        (0, "diastolic_bp", 1.0, 0.0),      # so is a zero pressure
        (0, "ph", 2.0, 735.0),              # pH x 100 -> 7.35
        (0, "ph", 3.0, 6.4),                # inside the benchmark's bounds, not a pH
        (0, "ph", 4.0, 6.5),                # on the plausible bound: kept
        (0, "respiratory_rate", 5.0, 0.0),  # zero breaths: an artefact
        (0, "o2_saturation", 6.0, 0.0),
    ], 1)
    kept, rep = clean(o, FS)
    assert kept.value.tolist() == [7.35, 6.5] and kept.time.tolist() == [2.0, 4.0]
    assert rep.rescaled_rows.tolist() == [2] and rep.rescaled[CH["ph"]] == 1
    assert rep.implausible_rows.tolist() == [0, 1, 3, 5, 6]
    assert rep.implausible[CH["ph"]] == 1 and rep.dropped.sum() == 0


def test_plausibility_keeps_parity_for_data_that_passes_it() -> None:
    rng = np.random.default_rng(7)
    o = random_obs(rng, 40, 60)
    _, implausible, rescaled = plausibility_masks(o.channel, o.value, FS)
    assert implausible.any()
    ok = o.take(~implausible & ~rescaled)
    kept, rep = clean(ok, FS)
    assert rep.implausible.sum() == 0 and rep.rescaled.sum() == 0
    drop, _, clipped = cleaning_masks(ok.channel, ok.value, FS)  # the benchmark rule alone
    np.testing.assert_array_equal(kept.value, clipped[~drop])
    x, _ = discretize(kept, FS)
    np.testing.assert_array_equal(x, discretize_rows(kept, FS, np.full(40, 48.0)))


def test_normalizer_scales_only_continuous_columns() -> None:
    rng = np.random.default_rng(0)
    x, lengths = discretize(random_obs(rng, 30, 50), FS)
    norm = Normalizer.fit(x, lengths, FS)
    z = norm.transform(x, lengths)
    cont = FS.continuous_columns
    other = np.setdiff1d(np.arange(76), cont)
    np.testing.assert_array_equal(z[..., other], x[..., other])
    np.testing.assert_allclose(z[..., cont].reshape(-1, len(cont)).mean(0), 0, atol=1e-4)
    again = Normalizer.from_dict(norm.to_dict()).transform(x, lengths)
    np.testing.assert_array_equal(again, z)


def test_coverage_counts_stays_with_any_observation() -> None:
    c = coverage(obs([(0, "ph", 1, 7.3), (0, "ph", 2, 7.3), (1, "glucose", 1, 100)], 2), FS)
    assert c[CH["ph"]] == 0.5 and c[CH["glucose"]] == 0.5 and c[CH["heart_rate"]] == 0


@pytest.mark.parametrize("name", sorted(FEATURE_SETS))
def test_apply_rules_equals_both_rules_on_every_row(name: str) -> None:
    """`apply_rules` runs the rules only on rows outside the range no rule touches: on values
    at, just inside and just outside every bound (open ones included), scaled ones and NaN it
    decides exactly what the two rules applied to every row decide."""
    fs = FEATURE_SETS[name]
    rng = np.random.default_rng(3)
    edges = [np.inf, -np.inf, np.nan, 0.0]
    for v in fs.variables:
        for b in (v.plausible.low, v.plausible.high) if v.plausible else ():
            if b is not None:
                edges += [b, np.nextafter(b, np.inf), np.nextafter(b, -np.inf)]
                edges += [x * (v.plausible.scaled_by or 1.0) for x in edges[-3:]]
        if v.ranges is not None:
            r = v.ranges
            for b in (r.outlier_low, r.valid_low, r.valid_high, r.outlier_high):
                edges += [b, np.nextafter(b, np.inf), np.nextafter(b, -np.inf)]
    n = 20_000
    channel = rng.integers(fs.n_channels, size=n)
    value = np.where(rng.random(n) < 0.5, rng.choice(np.array(edges), n),
                     rng.normal(50, 60, n))
    got = apply_rules(channel, value, fs)
    plausible_value, implausible, rescaled = plausibility_masks(channel, value, fs)
    drop, clip, clipped = cleaning_masks(channel, plausible_value, fs)
    assert implausible.any() and drop.any() and clip.any()
    assert (~implausible & ~drop & ~clip).any()
    np.testing.assert_array_equal(got.value, clipped)
    np.testing.assert_array_equal(got.implausible, implausible)
    np.testing.assert_array_equal(got.rescaled, rescaled)
    np.testing.assert_array_equal(got.drop, drop & ~implausible)
    np.testing.assert_array_equal(got.clip, clip & ~implausible)
