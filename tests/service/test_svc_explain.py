"""ExplainAssets read-outs against their per-class definitions."""

from __future__ import annotations

import numpy as np

from scehr.schemas.manifest import Calibration
from scehr.service.explain import ExplainAssets, Prototypes, _row_dot, _unit_rows


def assets(counts: list[int | None], d: int = 4, seed: int = 0) -> ExplainAssets:
    rng = np.random.default_rng(seed)
    protos = [None if k is None else Prototypes.of(rng.normal(size=(k, d)).tolist(), [1] * k,
                                                    [10] * k, [0.5] * k) for k in counts]
    c = len(counts)
    return ExplainAssets(labels=[f"c{i}" for i in range(c)], u_unit=np.eye(c, d),
                         v_unit=np.eye(c, d), u=np.eye(c, d), v=np.eye(c, d), prototypes=protos,
                         margins=[None] * c)


def test_nearest_prototypes_equal_sorting_each_class_on_its_own() -> None:
    """Classes with 1 to 5 prototypes and one without; k above some classes' counts; a
    duplicated prototype (a tie) keeps its first index first, as a stable sort of the class
    alone does."""
    a = assets([3, None, 1, 5, 2])
    p3 = a.prototypes[3]
    assert p3 is not None
    p3.unit[4] = p3.unit[1]  # a tie
    a.__post_init__()
    z = np.random.default_rng(1).normal(size=(6, 4))
    z[0] = p3.unit[1]  # exactly on the tied pair
    got = a.nearest_prototypes(z, k=3)
    for c, p in enumerate(a.prototypes):
        if p is None:
            assert got[c] is None
            continue
        cos = _row_dot(_unit_rows(z), p.unit)
        idx = np.argsort(-cos, axis=1, kind="stable")[:, :3]
        found = got[c]
        assert found is not None
        np.testing.assert_array_equal(found[0], idx)
        np.testing.assert_array_equal(found[1], np.take_along_axis(cos, idx, axis=1))
    tied = got[3]
    assert tied is not None and tied[0][0, :2].tolist() == [1, 4]


def test_one_class_nearest_prototypes_equal_sorting_it_alone() -> None:
    """One class (mortality's layout) takes its own path: same indices, cosines and dtypes,
    a tie kept in index order, k above the class's count."""
    for k_protos in (1, 2, 5):
        a = assets([k_protos], seed=k_protos)
        p = a.prototypes[0]
        assert p is not None
        if k_protos > 2:
            p.unit[2] = p.unit[0]  # a tie
            a.__post_init__()
        z = np.random.default_rng(2).normal(size=(5, 4))
        z[0] = p.unit[0]
        [found] = a.nearest_prototypes(z, k=3)
        assert found is not None
        cos = _row_dot(_unit_rows(z), p.unit)
        idx = np.argsort(-cos, axis=1, kind="stable")[:, :3]
        assert found[0].dtype == idx.dtype and found[1].dtype == np.float64
        np.testing.assert_array_equal(found[0], idx)
        np.testing.assert_array_equal(found[1], np.take_along_axis(cos, idx, axis=1))


def test_no_prototypes_at_all() -> None:
    assert assets([None, None]).nearest_prototypes(np.ones((2, 4)), k=3) == [None, None]


def test_isotonic_knots_follow_a_new_x() -> None:
    """The knots are cached as arrays; a calibration copied with other knots uses its own."""
    cal = Calibration(method="isotonic", x=[0.0, 1.0], y=[0.0, 1.0])
    p = np.array([0.25])
    assert cal.apply(p, p)[0] == 0.25
    other = cal.model_copy(update={"y": [0.5, 0.5]})
    assert other.apply(p, p)[0] == 0.5 and cal.apply(p, p)[0] == 0.25
