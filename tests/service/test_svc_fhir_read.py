"""The one Observation reader (`fhir_read.ObservationReader`) against the lean model whose
elements it reads: on generated and mutated Observations it refuses exactly what the lean model
refuses (which then names the error) and reads what `StayBuilder` takes with the lean model's
values; the complete-Bundle reader (`fhir_read.bundle`) reads a Bundle as the lean model does
or leaves it to it; a stay read with the lean validation is the stay read with the full one,
and its columns are ingested as its JSON payload would be."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from scehr.schemas.featureset import FEATURE_SETS, FeatureSet
from scehr.schemas.ingest import ingest_stay
from scehr.schemas.payloads import StayPayload
from scehr.schemas.variables import LOINC_SYSTEM, VARIABLES, loinc_index
from scehr.service.errors import ApiError
from scehr.service.interop import fhir_in, fhir_lean, fhir_read
from scehr.service.interop.fhir_in import bundle_resources, read_bundle
from scehr.service.interop.fhir_read import Invalid, ObservationReader, loinc_of, unit_of
from tests.service.conftest import columns_read

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
UCUM_SYSTEMS = st.one_of(st.just("http://unitsofmeasure.org"), TOKENS)
#: A component as a blood-pressure panel has them, some elements changed.
COMPONENTS = st.fixed_dictionaries({"code": st.one_of(
    st.sampled_from([{"coding": [{"system": LOINC_SYSTEM, "code": c}]}
                     for c in ("8480-6", "8462-4", "8867-4", "0000-0")]), ANY_JSON)},
    optional={"valueQuantity": st.one_of(st.fixed_dictionaries(
        {"value": NUMBERS}, optional={"unit": TOKENS, "system": UCUM_SYSTEMS,
                                      "code": TOKENS}), ANY_JSON),
              "valueInteger": NUMBERS, "valueString": TOKENS, "valueBoolean": ANY_JSON})
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
                                                  "valueInteger": 1}]),
                              st.lists(st.one_of(COMPONENTS, ANY_JSON), max_size=3)),
    ("component", 0, "valueQuantity", "value"): NUMBERS,
    ("component", 0, "code", "coding", 0, "code"): TOKENS,
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
    """The example's Observation in one of the shapes the reader reads (its value as
    valueQuantity, valueInteger, valueString, components or none; its time as
    effectiveDateTime, effectiveInstant or effectivePeriod), a few elements changed, removed
    or added."""
    obs = copy.deepcopy(draw(st.sampled_from(_example_observations()[:20])))
    q = obs.pop("valueQuantity")
    value = draw(st.sampled_from(["valueQuantity", "valueInteger", "valueString",
                                  "component", None]))
    if value == "valueQuantity":
        obs[value] = q
    elif value == "valueInteger":
        obs[value] = draw(st.one_of(st.just(int(q["value"])), NUMBERS))
    elif value == "valueString":
        obs[value] = draw(st.one_of(st.sampled_from(["4", "Spontaneously", "x"]), TOKENS))
    elif value == "component":
        obs[value] = draw(st.lists(COMPONENTS, min_size=1, max_size=3))
    time = obs.pop("effectiveDateTime")
    at = draw(st.sampled_from(["effectiveDateTime", "effectiveInstant", "effectivePeriod"]))
    obs[at] = time if at != "effectivePeriod" else draw(st.fixed_dictionaries(
        {}, optional={"start": st.just(time), "end": st.one_of(st.just(time), TIMES)}))
    paths = draw(st.lists(st.sampled_from(list(CHANGES)), max_size=4))
    for path in paths:
        _apply(obs, path, draw(st.one_of(st.just(ABSENT), CHANGES[path])))
    return obs


def _time(value: Any) -> Any:
    if isinstance(value, datetime):
        return value, value.utcoffset(), type(value.tzinfo)
    return value, type(value)


def _part(part: Any) -> tuple[Any, ...]:
    """A value as read, with the type of its value."""
    return (*part, type(part[2]))


def _read(obs: fhir_read.ObservationRead) -> tuple[Any, ...]:
    """Everything the stay reads of an Observation (time zones and value types included)."""
    return (obs.id, obs.status, obs.subject, obs.encounter, _time(obs.when), _part(obs.value),
            [_part(c) for c in obs.components])


def _expected(obs: Any, codes: Any) -> tuple[Any, ...]:
    """What the stay reads of a validated Observation (lean or `fhir.resources` model), read
    element by element: the reference the reader is held to."""
    def when() -> Any:
        if isinstance(obs.effectiveDateTime, datetime):
            return obs.effectiveDateTime
        if obs.effectiveInstant is not None:
            return obs.effectiveInstant
        p = obs.effectivePeriod
        t = None if p is None else (p.start if p.start is not None else p.end)
        return t if isinstance(t, datetime) else None

    def value(holder: Any) -> tuple[Any, ...]:
        loinc = loinc_of([(c.system, c.code) for c in holder.code.coding or []], codes)
        q = holder.valueQuantity
        if q is not None and q.value is not None:
            read = float(q.value), unit_of(q.system, q.code, q.unit), "valueQuantity"
        elif holder.valueInteger is not None:
            read = float(holder.valueInteger), None, "valueInteger"
        elif holder.valueString is not None:
            read = holder.valueString, None, "valueString"
        else:
            read = None, None, fhir_read.NO_VALUE
        return _part((*loinc, *read))

    return (obs.id, obs.status, None if obs.subject is None else obs.subject.reference,
            None if obs.encounter is None else obs.encounter.reference, _time(when()),
            value(obs), [value(c) for c in obs.component or []])


def _lean(raw: dict[str, Any], context: dict[str, Any] | None = None) -> Any:
    try:
        return fhir_lean.Observation.model_validate(
            raw, context=fhir_lean.seen_times() if context is None else context)
    except ValidationError:
        return None


def _reader(raw: dict[str, Any], codes: Any = None,
            context: dict[str, Any] | None = None) -> Any:
    reader = ObservationReader(loinc_index(VARIABLES) if codes is None else codes,
                               fhir_lean.seen_times() if context is None else context)
    try:
        return reader.read(raw)
    except Invalid:
        return None


VARIABLE_SETS = [VARIABLES, VARIABLES[::2]]


@SETTINGS
@given(observations(), st.sampled_from(VARIABLE_SETS))
def test_the_reader_refuses_what_the_lean_model_refuses_and_reads_its_values(
        raw: dict[str, Any], variables: Any) -> None:
    codes = loinc_index(variables)
    before = copy.deepcopy(raw)
    read, lean = _reader(raw, codes), _lean(raw)
    assert raw == before  # nothing changed in the request's tree
    assert (read is None) == (lean is None), raw
    if read is not None:
        assert _read(read) == _expected(lean, codes), raw


@SETTINGS
@given(observations())
def test_a_time_is_read_alike_from_the_requests_cache(raw: dict[str, Any]) -> None:
    """A dateTime the reader parsed is stored in the request's cache, where the lean models
    read it; one a lean model stored is read by the reader: the same values either way."""
    codes = loinc_index(VARIABLES)
    alone, lean_alone = _reader(raw, codes), _lean(raw)
    context = fhir_lean.seen_times()
    read_first = _reader(raw, codes, context)
    lean_after = _lean(raw, context)
    other = fhir_lean.seen_times()
    lean_first = _lean(raw, other)
    read_after = _reader(raw, codes, other)
    if alone is not None:
        assert _read(read_first) == _read(read_after) == _read(alone)
        assert _expected(lean_after, codes) == _expected(lean_first, codes) == \
            _expected(lean_alone, codes)


#: A blood-pressure panel: its values in components, the panel's own code read by no model.
PANEL = {**{k: v for k, v in BASE.items() if k not in ("code", "valueQuantity")},
         "code": {"coding": [{"system": LOINC_SYSTEM, "code": "85354-9"}]},
         "component": [{"code": {"coding": [{"system": LOINC_SYSTEM, "code": c}]},
                        "valueQuantity": {"value": v, "unit": "mmHg", "code": "mm[Hg]",
                                          "system": "http://unitsofmeasure.org"}}
                       for c, v in (("8480-6", 120), ("8462-4", 80.5))]}


def test_the_example_stays_observations_are_read_without_the_lean_model() -> None:
    """Not vacuous: the common shapes (valueQuantity, valueInteger, a panel's components,
    effectiveDateTime) are read by the reader itself, as the lean model reads them."""
    integer = {**copy.deepcopy(BASE), "valueInteger": 14}
    integer.pop("valueQuantity")
    codes = loinc_index(VARIABLES)
    for raw in [*_example_observations(), integer, PANEL]:
        read, lean = _reader(raw, codes), _lean(raw)
        assert read is not None and lean is not None
        assert _read(read) == _expected(lean, codes)
    assert [c[1].id for c in _reader(PANEL, codes).components] == ["systolic_bp",
                                                                   "diastolic_bp"]


@pytest.mark.parametrize("text", [
    "2026-01-15T08:30:00Z", "2026-01-15T08:30:00+05:30", "2026-01-15T08:30:00-00:00",
    "2026-01-15T08:30:00-13:59", "2024-02-29T23:59:59+01:00"])
def test_a_date_time_in_the_common_form_is_the_lean_one(text: str) -> None:
    fast = fhir_read.date_time(text)
    lean = fhir_lean.Observation.model_validate(
        {**BASE, "effectiveDateTime": text}).effectiveDateTime
    assert fast is not None and _time(fast) == _time(lean)


def test_a_bundle_reads_the_same_resources_with_the_lean_and_the_full_validation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every Observation of the example is read by the reader (the lean model is never
    asked), and read as the library's full model reads it."""
    bundle = json.loads((REPO / "examples" / "fhir_bundle.json").read_text())
    codes = loinc_index(VARIABLES)
    full = bundle_resources(copy.deepcopy(bundle), full=True, codes=codes)
    real = fhir_in.validate
    monkeypatch.setattr(fhir_in, "validate", lambda model, *a, **kw: (
        pytest.fail("an Observation validated by the lean model")
        if model is fhir_lean.Observation else real(model, *a, **kw)))
    lean = bundle_resources(copy.deepcopy(bundle), codes=codes)
    assert [(r.kind, r.loc, r.ref, r.full_url) for r in lean] == [
        (r.kind, r.loc, r.ref, r.full_url) for r in full]
    observations = [_read(r.resource) for r in lean if r.kind == "Observation"]
    assert len(observations) == 244
    assert observations == [_read(r.resource) for r in full if r.kind == "Observation"]
    entries = [e["resource"] for e in bundle["entry"]]
    assert observations == [_expected(fhir_lean.Observation.model_validate(raw), codes)
                            for raw in entries if raw["resourceType"] == "Observation"]


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
def test_edge_values_are_read_as_the_lean_model_reads_them_or_refused_alike(
        path: tuple[str, ...], value: Any, integer: bool) -> None:
    raw = copy.deepcopy(BASE)
    if integer:
        raw["valueInteger"] = raw.pop("valueQuantity")["value"]
        if path[0] == "valueQuantity":
            path = ("valueInteger",)
    _apply(raw, path, value)
    codes = loinc_index(VARIABLES)
    read, lean = _reader(raw, codes), _lean(raw)
    assert (read is None) == (lean is None), raw
    if read is not None:
        assert _read(read) == _expected(lean, codes), raw


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
def test_the_bundle_reader_accepts_only_what_the_lean_model_accepts_with_its_values(
        raw: dict[str, Any]) -> None:
    fast = fhir_read.bundle(raw)
    if fast is not None:
        try:
            lean = fhir_lean.Bundle.model_validate(raw)
        except ValidationError:
            pytest.fail(f"the lean model refuses {raw}")
        assert _bundle_read(fast) == _bundle_read(lean)


def test_the_example_bundle_is_read_without_the_lean_model() -> None:
    raw = json.loads((REPO / "examples" / "fhir_bundle.json").read_text())
    fast = fhir_read.bundle(raw)
    assert fast is not None
    assert _bundle_read(fast) == _bundle_read(fhir_lean.Bundle.model_validate(raw))


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


#: Refusals of what was read (after validation): the stay's own rules.
STAY_RULES = {"fhir_subject_mismatch", "fhir_subject_required", "fhir_value_out_of_range",
              "fhir_patient_count", "admission_time_required"}


def _stay(raw: dict[str, Any], variables: Any, full: bool = False) -> Any:
    """What reading the Bundle gives: the stay's parts, or the refusal."""
    try:
        s = read_bundle(copy.deepcopy(raw), variables=variables, full=full)
    except ApiError as e:
        return e.status, e.error, [p.model_dump() for p in e.detail]
    return (columns_read(s.payload), s.patient, s.encounter, s.basis, s.sources, s.issues,
            s.refs)


@SETTINGS
@given(stay_bundles(), st.sampled_from(VARIABLE_SETS))
def test_a_stay_read_with_the_lean_validation_is_the_stay_read_with_the_full_one(
        raw: dict[str, Any], variables: Any) -> None:
    """Observations, their sources and references, warnings: the same whichever validation,
    when the full one (which also refuses elements the adapter never reads) accepts the
    Bundle; what the lean validation refuses, the full one refuses, and for the same stay
    rule when both pass validation."""
    lean, full = _stay(raw, variables), _stay(raw, variables, full=True)
    if not isinstance(full[0], int):
        assert lean == full
    if isinstance(lean[0], int):
        assert full[0] == lean[0] == 422, (lean, full)
        if {p["rule"] for p in lean[2] + full[2]} <= STAY_RULES:
            assert lean == full


def test_the_example_stay_is_read_alike_with_the_lean_and_the_full_validation() -> None:
    """Not vacuous: the example read for a model that reads some of its codes (the others
    are warnings), and with blood-pressure panels, is the same stay both ways."""
    raw = json.loads((REPO / "examples" / "fhir_bundle.json").read_text())
    raw["entry"].append({"fullUrl": "urn:uuid:panel", "resource": copy.deepcopy(PANEL)})
    stays = {}
    for variables in VARIABLE_SETS:
        stays[len(variables)] = lean = _stay(raw, variables)
        assert lean == _stay(raw, variables, full=True)
    assert stays[len(VARIABLES[::2])][5], "some codes are not this model's"
    held = [src[0][-2:] for src in stays[len(VARIABLES)][4]]
    assert ["component", 0] in held and ["component", 1] in held


def _payload(s: fhir_in.FhirStay) -> StayPayload:
    """The stay's observations as the JSON route takes them, validated by its models."""
    cols = s.payload.columns
    return StayPayload.model_validate({
        "id": s.payload.id, "admission_time": cols.admission, "end_hours": s.payload.end_hours,
        "demographics": s.payload.demographics.model_dump(),
        "observations": [{"variable": v, "time": t, "value": x, "unit": u} for v, t, x, u in
                         zip(cols.variable, cols.time, cols.value, cols.unit, strict=True)]})


def _ingested(stay: Any, fs: FeatureSet) -> tuple[Any, ...]:
    out = ingest_stay(stay, fs)
    return (out.channel.tolist(), out.time.tolist(), out.value.tolist(), out.loc,
            out.static, out.end_hours, [p.model_dump() for p in out.problems],
            [n.model_dump() for n in out.notices])


@SETTINGS
@given(stay_bundles(), st.sampled_from([FEATURE_SETS["benchmark76-48h"],
                                        FEATURE_SETS["physionet2012-full"]]))
def test_a_stay_read_from_fhir_is_ingested_as_its_json_payload(
        raw: dict[str, Any], fs: FeatureSet) -> None:
    """The columns hold only what the JSON route's models accept, and ingest reads them as
    it reads the same observations sent as JSON: rows, notices, problems and field paths."""
    try:
        s = read_bundle(copy.deepcopy(raw), variables=fs.variables)
    except ApiError:
        return
    assert _ingested(s.payload, fs) == _ingested(_payload(s), fs)


def test_the_example_stay_is_ingested_as_its_json_payload() -> None:
    raw = json.loads((REPO / "examples" / "fhir_bundle.json").read_text())
    for fs in (FEATURE_SETS["benchmark76-48h"], FEATURE_SETS["physionet2012-full"]):
        s = read_bundle(raw, variables=fs.variables)
        assert len(s.payload.columns.value) > 150
        assert _ingested(s.payload, fs) == _ingested(_payload(s), fs)


def test_the_full_validation_reads_an_element_the_library_takes_as_json_text() -> None:
    """`fhir.resources` reads a complex element given as a string of JSON text: the full
    validation scores it as the element itself; the lean one refuses it, naming it."""
    raw = json.loads((REPO / "examples" / "fhir_bundle.json").read_text())
    changed = copy.deepcopy(raw)
    obs = changed["entry"][3]["resource"]
    obs["valueQuantity"] = json.dumps(obs["valueQuantity"])
    assert _stay(changed, VARIABLES, full=True) == _stay(raw, VARIABLES, full=True)
    status, _, problems = _stay(changed, VARIABLES)
    assert (status, problems[0]["loc"], problems[0]["rule"]) == (
        422, ["body", "entry", 3, "resource", "valueQuantity"], "fhir_object_expected")
