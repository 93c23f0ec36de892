"""The Observation fast path (`fhir_fast.observation`) against the lean model it stands in
for: whatever it accepts, the lean model accepts with the same values; what it does not take
goes to the lean model (so every refusal keeps its location, rule and message)."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from pydantic_core import TzInfo

from scehr.schemas.payloads import Observation
from scehr.schemas.variables import VARIABLES, loinc_index
from scehr.service.errors import ApiError
from scehr.service.interop import fhir_fast, fhir_in, fhir_lean, fhir_rows
from scehr.service.interop.fhir_in import StayBuilder, bundle_resources, read_bundle

REPO = Path(__file__).resolve().parents[2]
SETTINGS = settings(max_examples=400, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _example_observations() -> list[dict[str, Any]]:
    bundle = json.loads((REPO / "examples" / "fhir_bundle.json").read_text())
    return [e["resource"] for e in bundle["entry"]
            if e["resource"]["resourceType"] == "Observation"]


BASE = _example_observations()[0]
ANY_JSON = st.one_of(
    st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=True),
    st.text(max_size=8), st.lists(st.integers(), max_size=2),
    st.dictionaries(st.sampled_from(["system", "code", "value"]), st.text(max_size=4),
                    max_size=2))
TOKENS = st.one_of(
    st.sampled_from(["final", "amended", "8867-4", "http://loinc.org", "mm[Hg]", "{score}",
                     "/min", "", " ", "a b", "a  b", "x ", "\tx", "é", "a\nb", "\u2003",
                     "\x0b", "\ud800"]),
    st.text(max_size=6), ANY_JSON)
TIMES = st.one_of(
    st.builds(lambda d, off, fmt: d.replace(tzinfo=timezone(timedelta(minutes=off)))
              .strftime(fmt).replace("+0000", "Z"),
              st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31)),
              st.integers(-24 * 60 + 1, 24 * 60 - 1),
              st.sampled_from(["%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S.%f%z",
                               "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d", "%Y-%m", "%Y",
                               "%Y-%m-%dT%H:%M%z"]))
    .map(lambda s: s[:-2] + ":" + s[-2:] if s[-5:-4] in "+-" and s[-4:].isdigit() else s),
    st.sampled_from(["2026-01-15T08:30:00Z", "2026-02-30T08:30:00Z", "2026-01-15T24:00:00Z",
                     "2026-01-15T08:30:60Z", "2026-01-15T08:30:00+14:00",
                     "2026-01-15T08:30:00-14:00", "2026-01-15T08:30:00+13:59",
                     "2026-01-15T08:30:00+14:30",
                     "2026-01-15T08:30:00-00:00", "0000-01-15T08:30:00Z",
                     "2026-01-15T08:30:00z", "2026-01-15t08:30:00Z", "2026-01-15 08:30:00Z",
                     "2026-01-15T08:30:00Z\n", "２０２６-01-15T08:30:00Z"]),
    ANY_JSON)
NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**70, 2**70),
                    st.sampled_from([0, -0.0, 1e308, 5e-324, 2**31, -2**31, 2**31 - 1, True,
                                     "90", "1e3", " 90"]), ANY_JSON)
#: Element -> values to put there (ABSENT: remove it).
ABSENT = object()
CHANGES: dict[tuple[str, ...], st.SearchStrategy[Any]] = {
    ("id",): st.one_of(TOKENS, st.sampled_from(["o-1.2", "x" * 64, "x" * 65, "x" * 256])),
    ("status",): TOKENS,
    ("code",): ANY_JSON,
    ("code", "coding"): st.one_of(ANY_JSON, st.lists(
        st.fixed_dictionaries({}, optional={"system": TOKENS, "code": TOKENS}), max_size=3)),
    ("code", "coding", 0, "system"): TOKENS,
    ("code", "coding", 0, "code"): TOKENS,
    ("subject",): ANY_JSON,
    ("subject", "reference"): TOKENS,
    ("encounter",): st.one_of(ANY_JSON, st.fixed_dictionaries(
        {}, optional={"reference": TOKENS})),
    ("encounter", "reference"): TOKENS,
    ("effectiveDateTime",): TIMES,
    ("effectiveInstant",): TIMES,
    ("effectivePeriod",): st.one_of(ANY_JSON, st.fixed_dictionaries(
        {}, optional={"start": TIMES, "end": TIMES})),
    ("valueQuantity",): ANY_JSON,
    ("valueQuantity", "value"): NUMBERS,
    ("valueQuantity", "unit"): TOKENS,
    ("valueQuantity", "system"): TOKENS,
    ("valueQuantity", "code"): TOKENS,
    ("valueInteger",): NUMBERS,
    ("valueString",): TOKENS,
    ("valueBoolean",): ANY_JSON,
    ("valueCodeableConcept",): ANY_JSON,
    ("component",): st.one_of(ANY_JSON, st.just([{"code": {"coding": []},
                                                  "valueInteger": 1}])),
    ("category",): ANY_JSON,
    ("vendorNote",): ANY_JSON,
}


def _apply(obs: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    holder: Any = obs
    for step in path[:-1]:
        try:
            holder = holder[step]
        except (KeyError, IndexError, TypeError):
            return  # the change's parent was changed away: nothing to do
    if isinstance(holder, dict):
        if value is ABSENT:
            holder.pop(path[-1], None)
        else:
            holder[path[-1]] = value
    elif isinstance(holder, list) and isinstance(path[-1], int) and path[-1] < len(holder) \
            and value is not ABSENT:
        holder[path[-1]] = value


@st.composite
def observations(draw: st.DrawFn) -> dict[str, Any]:
    """The example's Observation with a few elements changed, removed or added."""
    obs = copy.deepcopy(draw(st.sampled_from(_example_observations()[:20])))
    if draw(st.booleans()):  # the other value[x] the fast path reads
        obs["valueInteger"] = draw(st.one_of(st.just(int(obs.pop("valueQuantity")["value"])),
                                             NUMBERS))
    paths = draw(st.lists(st.sampled_from(list(CHANGES)), max_size=4))
    for path in paths:
        _apply(obs, path, draw(st.one_of(st.just(ABSENT), CHANGES[path])))
    return obs


def _time(value: Any) -> Any:
    if isinstance(value, datetime):
        return value, value.utcoffset(), type(value.tzinfo)
    return value, type(value)


def _read(obs: Any) -> tuple[Any, ...]:
    """Every element the adapter reads, as it reads it (types and time zones included)."""
    q = obs.valueQuantity
    return (
        obs.id, obs.status, obs.get_resource_type(),
        None if obs.code.coding is None else [(c.system, c.code) for c in obs.code.coding],
        None if obs.subject is None else obs.subject.reference,
        None if obs.encounter is None else obs.encounter.reference,
        _time(obs.effectiveDateTime), obs.effectiveInstant, obs.effectivePeriod,
        None if q is None else (q.value, str(q.value), q.unit, q.system, q.code),
        (obs.valueInteger, type(obs.valueInteger)), obs.valueString, obs.component)


def _lean(raw: dict[str, Any]) -> Any:
    try:
        return fhir_lean.Observation.model_validate(raw, context=fhir_lean.seen_times())
    except ValidationError:
        return None


@SETTINGS
@given(observations())
def test_the_fast_path_accepts_only_what_the_lean_model_accepts_with_its_values(
        raw: dict[str, Any]) -> None:
    before = copy.deepcopy(raw)
    fast = fhir_fast.observation(raw, fhir_lean.seen_times())
    assert raw == before  # nothing changed in the request's tree
    if fast is not None:
        lean = _lean(raw)
        assert lean is not None, raw
        assert _read(fast) == _read(lean), raw


@SETTINGS
@given(observations())
def test_the_fast_path_reads_a_time_cached_or_not_alike(raw: dict[str, Any]) -> None:
    """A dateTime parsed by the fast path is stored in the request's cache; the next
    Observation with that text reads the same value, whichever path validated it first."""
    context = fhir_lean.seen_times()
    first, second = _lean(raw), fhir_fast.observation(raw, context)
    if "effectiveDateTime" in raw and second is not None:
        again = fhir_lean.Observation.model_validate(raw, context=context)
        assert _time(again.effectiveDateTime) == _time(second.effectiveDateTime)
        assert first is not None
        assert _time(first.effectiveDateTime) == _time(second.effectiveDateTime)


def test_the_example_stays_observations_take_the_fast_path() -> None:
    """Not vacuous: the common shape (valueQuantity or valueInteger, effectiveDateTime) is
    read without the lean model."""
    obs = _example_observations()
    integer = {**copy.deepcopy(obs[0]), "valueInteger": 14}
    integer.pop("valueQuantity")
    for raw in [*obs, integer]:
        fast, lean = fhir_fast.observation(raw, fhir_lean.seen_times()), _lean(raw)
        assert fast is not None and lean is not None
        assert _read(fast) == _read(lean)


@pytest.mark.parametrize("text", [
    "2026-01-15T08:30:00Z", "2026-01-15T08:30:00+05:30", "2026-01-15T08:30:00-00:00",
    "2026-01-15T08:30:00-13:59", "2024-02-29T23:59:59+01:00"])
def test_a_date_time_in_the_subset_is_the_lean_one(text: str) -> None:
    fast = fhir_fast.date_time(text)
    lean = fhir_lean.Observation.model_validate(
        {**BASE, "effectiveDateTime": text}).effectiveDateTime
    assert fast is not None and _time(fast) == _time(lean)


def test_a_bundle_reads_the_same_resources_with_and_without_the_fast_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = json.loads((REPO / "examples" / "fhir_bundle.json").read_text())
    fast = bundle_resources(copy.deepcopy(bundle))
    monkeypatch.setattr(fhir_fast, "observation", lambda raw, context=None: None)
    lean = bundle_resources(copy.deepcopy(bundle))
    assert [(r.loc, r.ref, r.full_url) for r in fast] == [(r.loc, r.ref, r.full_url)
                                                          for r in lean]
    assert [_read(r.resource) for r in fast if r.resource.get_resource_type() ==
            "Observation"] == [_read(r.resource) for r in lean
                               if r.resource.get_resource_type() == "Observation"]


EDGES: dict[tuple[str, ...], list[Any]] = {
    ("effectiveDateTime",): [
        "2026-01-15T08:30:00+14:00", "2026-01-15T08:30:00+14:30", "2026-01-15T08:30:00-14:00",
        "2026-02-30T08:30:00Z", "2026-01-15T24:00:00Z", "2026-01-15T08:30:60Z",
        "0000-01-15T08:30:00Z", "2026-01-15T08:30:00z", "2026-01-15 08:30:00Z",
        "2026-01-15T08:30:00Z\n", "2026-01-15T08:30Z", "2026-01-15", "2026", 20260115, None],
    ("valueQuantity", "value"): [
        float("inf"), float("-inf"), float("nan"), True, False, 2**31, -2**31, 10**20,
        1e308, -0.0, 5e-324, "90", None],
    ("valueQuantity", "unit"): ["", " ", "\t", "é", "\ud800", 5, None],
    ("valueQuantity", "code"): ["", "a b", "x ", "é", None],
    ("status",): ["", " final", "final ", "fi nal", "é", None, 1],
    ("id",): ["", "a b", "x" * 64, "x" * 65, "é", None, 1],
    ("subject", "reference"): ["", " ", "\x0b", "é", None, 1],
    ("encounter",): [{"reference": "Encounter/e"}, {"reference": ""}, {"reference": "é"},
                     {"reference": 1}, {}, None, 5, "Encounter/e"],
    ("code", "coding"): [None, [], {}, [None], [{}], [{"system": None}]],
}


@pytest.mark.parametrize(("path", "value"), [
    (path, value) for path, values in EDGES.items() for value in values])
@pytest.mark.parametrize("integer", [False, True])
def test_edge_values_are_the_lean_models_or_left_to_it(
        path: tuple[str, ...], value: Any, integer: bool) -> None:
    raw = copy.deepcopy(BASE)
    if integer:
        raw["valueInteger"] = raw.pop("valueQuantity")["value"]
        if path[0] == "valueQuantity":
            path = ("valueInteger",)
    _apply(raw, path, value)
    fast, lean = fhir_fast.observation(raw, fhir_lean.seen_times()), _lean(raw)
    if fast is not None:
        assert lean is not None and _read(fast) == _read(lean), raw


def test_the_payload_observations_built_together_are_those_built_one_by_one() -> None:
    """`StayBuilder.observations` validates the rows in one call: the same models, and, when
    one is refused, the very error building that one alone raises."""
    when = datetime(2026, 1, 15, 8, tzinfo=UTC)
    builder = StayBuilder(when, set(), {})
    builder.rows = [{"variable": "heart_rate", "time": when, "value": 80.0, "unit": "bpm"},
                    {"variable": "icu_type", "time": when, "value": "3", "unit": None}]
    assert builder.observations() == [Observation(**r) for r in builder.rows]
    builder.rows.append({"variable": "x", "time": when, "value": "\ud800", "unit": None})
    with pytest.raises(ValidationError) as together:
        builder.observations()
    with pytest.raises(ValidationError) as alone:
        Observation(**builder.rows[-1])
    assert together.value.errors() == alone.value.errors()


def _bundle_read(b: Any) -> tuple[Any, ...]:
    return (b.id, b.type, b.total, None if b.link is None else [
        (lk.relation, lk.url) for lk in b.link], None if b.entry is None else [
        (e.fullUrl, e.resource, None if e.search is None else e.search.mode) for e in b.entry])


BUNDLE_CHANGES: dict[tuple[Any, ...], st.SearchStrategy[Any]] = {
    ("id",): CHANGES[("id",)],
    ("type",): st.one_of(st.sampled_from(["collection", "searchset", "batch"]), TOKENS),
    ("total",): NUMBERS,
    ("link",): st.one_of(ANY_JSON, st.just([{"relation": "next", "url": "http://x"}])),
    ("entry",): st.one_of(ANY_JSON, st.lists(ANY_JSON, max_size=2)),
    ("entry", 0): ANY_JSON,
    ("entry", 0, "fullUrl"): TOKENS,
    ("entry", 0, "resource"): ANY_JSON,
    ("entry", 0, "search"): st.one_of(ANY_JSON, st.just({"mode": "match"})),
    ("entry", 1, "vendorNote"): ANY_JSON,
}


@st.composite
def bundles(draw: st.DrawFn) -> dict[str, Any]:
    raw = json.loads((REPO / "examples" / "fhir_bundle.json").read_text())
    raw["entry"] = raw["entry"][:4]
    for path in draw(st.lists(st.sampled_from(list(BUNDLE_CHANGES)), max_size=3)):
        _apply(raw, path, draw(st.one_of(st.just(ABSENT), BUNDLE_CHANGES[path])))
    return raw


@SETTINGS
@given(bundles())
def test_the_bundle_fast_path_accepts_only_what_the_lean_model_accepts_with_its_values(
        raw: dict[str, Any]) -> None:
    fast = fhir_fast.bundle(raw)
    if fast is not None:
        try:
            lean = fhir_lean.Bundle.model_validate(raw)
        except ValidationError:
            pytest.fail(f"the lean model refuses {raw}")
        assert _bundle_read(fast) == _bundle_read(lean)


def test_the_example_bundle_takes_the_fast_path() -> None:
    raw = json.loads((REPO / "examples" / "fhir_bundle.json").read_text())
    fast = fhir_fast.bundle(raw)
    assert fast is not None
    assert _bundle_read(fast) == _bundle_read(fhir_lean.Bundle.model_validate(raw))


# ---------------------------------------------------------------- rows for the stay

VARIABLE_SETS = [VARIABLES, VARIABLES[::2]]


def _row_read(raw: dict[str, Any], codes: Any) -> Any:
    return fhir_rows.RowReader(fhir_lean.seen_times(), codes).read(raw)


@SETTINGS
@given(observations(), st.sampled_from(VARIABLE_SETS))
def test_a_row_is_read_from_the_fast_paths_subset_as_the_lean_model_reads_it(
        raw: dict[str, Any], variables: Any) -> None:
    """`fhir_rows` takes exactly the Observations `fhir_fast.observation` takes, and reads
    what `StayBuilder` reads of the lean model: reference, subject, time, code and variable,
    value, unit and value[x] kind."""
    codes = loinc_index(variables)
    before = copy.deepcopy(raw)
    row = _row_read(raw, codes)
    assert raw == before
    assert (row is None) == (fhir_fast.observation(raw, fhir_lean.seen_times()) is None), raw
    if row is not None:
        lean = _lean(raw)
        assert lean is not None, raw
        assert (row.id, row.status, row.get_resource_type()) == (
            lean.id, lean.status, lean.get_resource_type())
        assert row.subject == (None if lean.subject is None else lean.subject.reference)
        assert row.encounter == (None if lean.encounter is None else lean.encounter.reference)
        assert _time(row.when) == _time(fhir_in._effective(lean))
        assert (row.code, row.variable) == fhir_in._loinc(lean.code, codes)
        assert (row.value, row.unit, row.kind) == fhir_in._value(lean)
        assert type(row.value) is type(fhir_in._value(lean)[0])


def _stay(raw: dict[str, Any], variables: Any) -> Any:
    """What reading the Bundle gives: the stay's parts, or the refusal."""
    try:
        s = read_bundle(copy.deepcopy(raw), variables=variables)
    except ApiError as e:
        return e.status, e.error, [p.model_dump() for p in e.detail]
    return (s.payload.model_dump(), s.patient, s.encounter, s.basis, s.sources, s.issues,
            s.refs, [(_time(o.time), o.model_fields_set) for o in s.payload.observations])


@st.composite
def stay_bundles(draw: st.DrawFn) -> dict[str, Any]:
    """The example Bundle with its Observations cut to a few, some of them changed."""
    raw = json.loads((REPO / "examples" / "fhir_bundle.json").read_text())
    others = [e for e in raw["entry"] if e["resource"]["resourceType"] != "Observation"]
    obs = [{"fullUrl": f"urn:uuid:{i}", "resource": draw(observations())}
           for i in range(draw(st.integers(1, 4)))]
    for e in obs:
        if draw(st.booleans()):
            e.pop("fullUrl")
    raw["entry"] = [*others[:draw(st.integers(2, len(others)))], *obs]
    return raw


@SETTINGS
@given(stay_bundles(), st.sampled_from(VARIABLE_SETS))
def test_a_stay_read_through_rows_is_the_stay_read_through_the_lean_model(
        raw: dict[str, Any], variables: Any) -> None:
    """Observations, their sources and references, warnings and refusals: the same whether
    the fast path's Observations are read as rows or by the lean model."""
    fast = _stay(raw, variables)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fhir_rows.RowReader, "read", lambda self, raw: None)
        lean = _stay(raw, variables)
    assert fast == lean


def test_the_example_stay_is_read_through_rows_as_through_the_lean_model(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Not vacuous: every Observation of the example is read as a row, and the stay (with
    its warnings of codes this model does not read) is the lean one."""
    raw = json.loads((REPO / "examples" / "fhir_bundle.json").read_text())
    codes = loinc_index(VARIABLES[::2])
    resources = bundle_resources(copy.deepcopy(raw), codes=codes)
    assert sum(type(r.resource) is fhir_rows.ObservationRow for r in resources) == 244
    fast = _stay(raw, VARIABLES[::2])
    assert fast[5], "some codes are not this model's"
    monkeypatch.setattr(fhir_rows.RowReader, "read", lambda self, raw: None)
    assert fast == _stay(raw, VARIABLES[::2])


TRUSTED_ROWS = [
    {"variable": "heart_rate", "time": datetime(2026, 1, 15, 8, tzinfo=TzInfo(3600)),
     "value": 80.5, "unit": "/min"},
    {"variable": "icu_type", "time": datetime(2026, 1, 15, 8, tzinfo=UTC), "value": "3",
     "unit": None},
    {"variable": "mechanical_ventilation", "time": datetime(2026, 1, 15, 9, tzinfo=UTC),
     "value": 1.0, "unit": None},
]


@pytest.mark.parametrize("row", TRUSTED_ROWS)
def test_a_trusted_row_is_the_model_validated_from_it(row: dict[str, Any]) -> None:
    built, valid = fhir_in.trusted(dict(row)), Observation.model_validate(row)
    assert built == valid == Observation.model_construct(**row)
    assert built.model_fields_set == valid.model_fields_set
    assert (built.__pydantic_extra__, built.__pydantic_private__) == (
        valid.__pydantic_extra__, valid.__pydantic_private__)
    assert built.model_dump_json() == valid.model_dump_json()
    assert _time(built.time) == _time(valid.time)


def test_checked_and_unchecked_rows_keep_their_order_and_errors() -> None:
    when = datetime(2026, 1, 15, 8, tzinfo=UTC)
    builder = StayBuilder(when, set(), {})
    unchecked = {"variable": "glascow_coma_scale_total", "time": when, "value": "15",
                 "unit": None}
    for row in [TRUSTED_ROWS[0], unchecked, TRUSTED_ROWS[1]]:
        builder.rows.append(dict(row))
        builder.checked.append(row is not unchecked)
    assert builder.observations() == [Observation(**r) for r in builder.rows]
    builder.rows.append({"variable": "x", "time": when, "value": "\ud800", "unit": None})
    builder.checked.append(False)
    with pytest.raises(ValidationError) as together:
        builder.observations()
    with pytest.raises(ValidationError) as alone:
        Observation(**builder.rows[-1])
    assert together.value.errors() == alone.value.errors()
