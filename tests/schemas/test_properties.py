"""hypothesis properties of the payload models and tensorize.

- any payload accepted by the models and the ingest rules gives a finite tensor of the
  documented shape [1, T, F] (T = the window's bins, or the stay's; F = fs.n_features);
- any payload refused names a field (a non-empty `loc`) and a rule;
- the long and the wide form of the same measurements give the same tensor.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from scehr.schemas.featureset import BENCHMARK_48H, BENCHMARK_STAY, FeatureSet
from scehr.schemas.ingest import ingest
from scehr.schemas.payloads import StayPayload
from scehr.schemas.tensorize import discretize

FEATURE_SETS = [BENCHMARK_48H, BENCHMARK_STAY]
CONTINUOUS = [v for v in BENCHMARK_48H.variables if not v.is_categorical]
IDS = [v.id for v in BENCHMARK_48H.variables]
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

junk = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                 st.sampled_from(["1.5", "71", "2026-01-01T00:00:00Z", "\ud800", "NaN"]))
times = st.one_of(st.floats(-5, 60, allow_nan=False), st.integers(-5, 60), junk)
values = st.one_of(st.floats(-1e4, 1e4, allow_nan=False), st.integers(0, 300),
                   st.sampled_from(["15", "4 Spontaneously", "Normal <3 secs", "0.0"]), junk)


@st.composite
def observation(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 20)) == 0:
        return draw(junk)  # not even an object
    var = draw(st.one_of(st.sampled_from(IDS), st.text(max_size=12)))
    obs: dict[str, Any] = {"variable": var, "time": draw(times), "value": draw(values)}
    known = next((v for v in BENCHMARK_48H.variables if v.id == var), None)
    if draw(st.booleans()):
        obs["unit"] = known.unit if known is not None and known.unit and draw(
            st.booleans()) else draw(junk)
    if draw(st.integers(0, 30)) == 0:
        obs["extra"] = 1
    return obs


@st.composite
def payload(draw: st.DrawFn) -> Any:
    raw: dict[str, Any] = {"observations": draw(st.lists(observation(), max_size=12))}
    if draw(st.booleans()):
        raw["demographics"] = {"age": draw(st.one_of(st.floats(0, 130), junk)),
                               "sex": draw(st.sampled_from(["female", "male", "x", None]))}
    if draw(st.booleans()):
        raw["end_hours"] = draw(st.one_of(st.floats(0.5, 300), junk))
    if draw(st.integers(0, 10)) == 0:
        raw["wide"] = {"hours": [1.0], "columns": {}}  # both forms: refused
    return raw


def _shape_ok(x: np.ndarray, lengths: np.ndarray, fs: FeatureSet) -> bool:
    t = int(fs.n_bins(fs.window_hours)) if fs.window_hours is not None else int(lengths.max())
    return x.shape == (1, t, fs.n_features) and 1 <= lengths[0] <= x.shape[1]


@SETTINGS
@given(raw=payload(), fs=st.sampled_from(FEATURE_SETS))
def test_accepted_gives_finite_tensor_refused_names_a_field(raw: Any, fs: FeatureSet) -> None:
    try:
        stay = StayPayload.model_validate(raw)
    except ValidationError as e:
        for err in e.errors():  # the field's path, or (the whole stay) the fields in the message
            assert err["type"] and (err["loc"] or "`observations`" in err["msg"]), err
        return
    res = ingest([stay], fs)
    if not res.ok:
        problems = res.stays[0].problems
        assert problems
        for p in problems:
            assert p.loc and p.rule and p.message
        return
    x, lengths = discretize(res.observations, fs, res.end_hours)
    assert np.isfinite(x).all()
    assert _shape_ok(x, lengths, fs), (x.shape, lengths)


@st.composite
def measurements(draw: st.DrawFn) -> list[tuple[str, float, float, str | None]]:
    """Distinct (variable, time) pairs of continuous variables with plain numbers."""
    keys = draw(st.lists(st.tuples(st.sampled_from(CONTINUOUS), st.integers(0, 190)),
                         min_size=1, max_size=25, unique_by=lambda k: (k[0].id, k[1])))
    out = []
    for var, quarter in keys:
        value = draw(st.floats(0, 200, allow_nan=False, width=32))
        out.append((var.id, quarter / 4.0, value, var.unit))
    return out


@SETTINGS
@given(rows=measurements(), fs=st.sampled_from(FEATURE_SETS))
def test_long_and_wide_forms_give_the_same_tensor(rows: list, fs: FeatureSet) -> None:
    long = StayPayload.model_validate({"observations": [
        {"variable": v, "time": t, "value": x, **({"unit": u} if u else {})}
        for v, t, x, u in rows]})
    hours = sorted({t for _, t, _, _ in rows})
    columns: dict[str, list[float | None]] = {}
    units: dict[str, str] = {}
    for v, t, x, u in rows:
        columns.setdefault(v, [None] * len(hours))[hours.index(t)] = x
        if u:
            units[v] = u
    wide = StayPayload.model_validate({"wide": {"hours": hours, "columns": columns,
                                                "units": units}})
    a, b = ingest([long], fs), ingest([wide], fs)
    assert len(a.ok) == len(b.ok)
    if not a.ok:
        assert [p.rule for p in a.stays[0].problems] == [p.rule for p in b.stays[0].problems]
        return
    xa, la = discretize(a.observations, fs, a.end_hours)
    xb, lb = discretize(b.observations, fs, b.end_hours)
    np.testing.assert_array_equal(la, lb)
    np.testing.assert_array_equal(xa, xb)
