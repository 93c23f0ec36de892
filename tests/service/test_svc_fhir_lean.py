"""The lean FHIR validation (the elements the adapter reads) against the full one
(`fhir.resources`, `SCEHR_FHIR_VALIDATION=full`): the same stay, the same risk, the same
refusals (location and rule) on malformed elements the adapter reads and on hostile bodies."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from scehr.service.errors import ApiError
from scehr.service.interop import fhir_in, fhir_lean
from scehr.service.interop.fhir_in import bundle_resources, read_bundle
from scehr.service.settings import Settings
from tests.service.conftest import columns_read, serve
from tests.service.fhir_writer import example_bundle, example_cds_request

pytestmark = pytest.mark.anyio
Mutation = Callable[[dict[str, Any]], Any]


def _obs(b: dict[str, Any]) -> dict[str, Any]:
    return next(e["resource"] for e in b["entry"] if e["resource"]["resourceType"]
                == "Observation" and "valueQuantity" in e["resource"])


def _typed(kind: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda b: next(e["resource"] for e in b["entry"]
                          if e["resource"]["resourceType"] == kind)


_patient, _encounter, _procedure, _location = (
    _typed("Patient"), _typed("Encounter"), _typed("Procedure"), _typed("Location"))

#: Malformed elements the adapter reads: each refused alike by both validations.
SAME: dict[str, Mutation] = {
    "value not a decimal": lambda b: _obs(b)["valueQuantity"].update(value="ninety"),
    "value a boolean": lambda b: _obs(b)["valueQuantity"].update(value=True),
    "unit a number": lambda b: _obs(b)["valueQuantity"].update(unit=5),
    "quantity a string": lambda b: _obs(b).update(valueQuantity="12 mmHg"),
    "quantity a number": lambda b: _obs(b).update(valueQuantity=12),
    "status missing": lambda b: _obs(b).pop("status"),
    "status a number": lambda b: _obs(b).update(status=3),
    "status empty": lambda b: _obs(b).update(status=""),
    "code missing": lambda b: _obs(b).pop("code"),
    "coding not a list": lambda b: _obs(b)["code"].update(coding={"system": "x"}),
    "LOINC code with a space at the end": lambda b: _obs(b)["code"]["coding"][0].update(
        code="8867-4 "),
    "time not a dateTime": lambda b: _obs(b).update(effectiveDateTime="yesterday"),
    "time without its timezone": lambda b: _obs(b).update(
        effectiveDateTime="2026-01-15T10:00:00"),
    "instant without a time": lambda b: _obs(b).update(effectiveInstant="2026-01-15"),
    "two effective[x]": lambda b: _obs(b).update(effectivePeriod={"start": "2026-01-15"}),
    "integer a fraction": lambda b: (_obs(b).pop("valueQuantity"),
                                     _obs(b).update(valueInteger=1.5)),
    "two value[x]": lambda b: _obs(b).update(valueString="x"),
    "value[x] not read, beside one read": lambda b: _obs(b).update(valueBoolean=True),
    "subject reference a number": lambda b: _obs(b)["subject"].update(reference=5),
    "id with a space": lambda b: _obs(b).update(id="bad id"),
    "component without a code": lambda b: _obs(b).update(component=[{"valueInteger": 1}]),
    "birthDate month 13": lambda b: _patient(b).update(birthDate="1950-13-01"),
    "gender a list": lambda b: _patient(b).update(gender=["female"]),
    "encounter status missing": lambda b: _encounter(b).pop("status"),
    "period start not a dateTime": lambda b: _encounter(b)["period"].update(start="monday"),
    "procedure subject missing": lambda b: _procedure(b).pop("subject"),
    "procedure period and dateTime": lambda b: _procedure(b).update(
        performedPeriod={"start": "2026-01-15T09:00:00Z"}),
    "location type not a list": lambda b: _location(b).update(type={"text": "ICU"}),
    "observation encounter reference a number": lambda b: _obs(b).update(
        encounter={"reference": 5}),
    "procedure encounter a string": lambda b: _procedure(b).update(
        encounter="Encounter/example-icu"),
    "encounter subject reference a number": lambda b: _encounter(b)["subject"].update(
        reference=5),
    "encounter partOf a list": lambda b: _encounter(b).update(
        partOf=[{"reference": "Encounter/x"}]),
    "encounter location without its location": lambda b: _encounter(b).update(location=[{}]),
    "encounter location period start not a dateTime": lambda b: _encounter(b)["location"][
        0].update(period={"start": "monday"}),
    "bundle type missing": lambda b: b.pop("type"),
    "bundle total negative": lambda b: b.update(total=-1),
    "link without its url": lambda b: b.update(link=[{"relation": "self"}]),
    "entry not an object": lambda b: b["entry"].append(5),
    "unknown resourceType": lambda b: b["entry"].append({"resource": {"resourceType": "Foo"}}),
    "resourceType a number": lambda b: b["entry"].append({"resource": {"resourceType": 7}}),
    "a time valid in Observations, the same text in a period end": lambda b: (
        _encounter(b)["period"].update(end=_obs(b)["effectiveDateTime"]),
        _procedure(b).update(performedDateTime="2026-01-15T09:00:00+15:00")),
}
#: Accepted alike (FHIR allows them; the adapter warns or reads them).
ACCEPTED: dict[str, Mutation] = {
    "value a numeric string": lambda b: _obs(b)["valueQuantity"].update(value="90"),
    "value of 309 digits (refused after, by range)": lambda b: None,
    "status outside the value set": lambda b: _obs(b).update(status="nonsense"),
    "time a date only": lambda b: _obs(b).update(effectiveDateTime="2026-01-16"),
    "time a year only": lambda b: _obs(b).update(effectiveDateTime="2026"),
    "a resource type not read": lambda b: b["entry"].append(
        {"resource": {"resourceType": "Medication", "id": "m1"}}),
}


def _every_time(text: str) -> Mutation:
    return lambda b: [e["resource"].update(effectiveDateTime=text) for e in b["entry"]
                      if e["resource"]["resourceType"] == "Observation"]


@pytest.mark.parametrize("change", [
    lambda b: None, _every_time("2026-13-01T00:00:00Z"), _every_time("2026-01"),
    _every_time("2026-01-15T09:00:60Z"), _every_time("2026-01-15")])
def test_a_time_validated_once_per_request_reads_and_refuses_as_each_time(
        change: Mutation, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each distinct dateTime string is validated once per request (`fhir_lean.seen_times`):
    the same values and the same refusals as validating every one."""
    b = example_bundle()
    change(b)

    def read() -> Any:
        try:
            return [r.resource for r in bundle_resources(copy.deepcopy(b))]
        except ApiError as e:
            return e.status, [(p.loc, p.rule, p.message) for p in e.detail]

    once = read()
    monkeypatch.setattr(fhir_lean, "seen_times", dict)  # a context without the cache
    assert read() == once


def _outcome(raw: dict[str, Any], full: bool) -> Any:
    try:
        resources = bundle_resources(raw, full=full)
    except ApiError as e:
        return e.status, [(p.loc, p.rule, p.message.split(":", 1)[0]) for p in e.detail]
    return [(r.kind, r.resource.id, r.loc) for r in resources]


@pytest.mark.parametrize("name", [*SAME, *ACCEPTED])
def test_lean_and_full_validation_refuse_and_accept_alike(name: str) -> None:
    b = example_bundle()
    (SAME | ACCEPTED)[name](b)
    lean, full = _outcome(copy.deepcopy(b), False), _outcome(copy.deepcopy(b), True)
    assert lean == full, name
    refused = isinstance(lean, tuple)
    assert refused is (name in SAME), lean
    if refused:
        assert lean[0] == 422 and all(rule.startswith("fhir_") for _, rule, _ in lean[1])


def test_lean_and_full_read_the_same_stay() -> None:
    b = example_bundle()
    lean, full = read_bundle(copy.deepcopy(b)), read_bundle(copy.deepcopy(b), full=True)
    assert columns_read(lean.payload) == columns_read(full.payload)
    assert len(lean.payload.columns.value) > 150
    assert (lean.basis, lean.sources, lean.refs, lean.issues) == \
        (full.basis, full.sources, full.refs, full.issues)


def test_unknown_resource_types_are_not_remembered() -> None:
    """Resource types are looked up once per process, but only those FHIR has: what clients
    send cannot grow the set."""
    for i in range(50):
        b = example_bundle()
        b["entry"].append({"resource": {"resourceType": f"Foo{i}"}})
        assert _outcome(b, False)[0] == 422
    assert not any(t.startswith("Foo") for t in fhir_in._KNOWN_TYPES)
    assert {"Observation", "Patient", "Encounter"} <= fhir_in._KNOWN_TYPES


def test_lean_validation_reads_only_what_the_adapter_reads() -> None:
    """An element the adapter never reads (unknown, or required but unused) is refused by
    the full validation only: the documented difference."""
    b = example_bundle()
    _obs(b)["vendorNote"] = "x"
    _encounter(b).pop("class")
    assert isinstance(_outcome(copy.deepcopy(b), False), list)
    status, problems = _outcome(b, True)
    assert status == 422 and {rule for _, rule, _ in problems} <= {
        "fhir_extra_forbidden", "fhir_missing"}


def _hostile() -> dict[str, bytes]:
    deep: dict[str, Any] = {"url": "http://example.org/x", "valueString": "leaf"}
    for _ in range(300):
        deep = {"url": "http://example.org/x", "extension": [deep]}
    bodies = {"valid": example_bundle()}
    for name, change in {
        "309 digits": lambda b: _obs(b)["valueQuantity"].update(value=int("9" * 309)),
        "string quantity": lambda b: _obs(b).update(valueQuantity="12 mmHg"),
        "2 MB code": lambda b: _obs(b)["code"]["coding"][0].update(code="7" * 2_000_000),
        "nested 300 deep": lambda b: _patient(b).update(extension=[deep]),
        "600 Observations": lambda b: b["entry"].extend([copy.deepcopy(b["entry"][3])] * 600),
        "unknown resourceType": SAME["unknown resourceType"],
    }.items():
        b = example_bundle()
        change(b)
        bodies[name] = b
    out = {k: json.dumps(v).encode() for k, v in bodies.items()}
    out["empty entries"] = (b'{"resourceType":"Bundle","type":"collection","entry":['
                            + b",".join([b"{}"] * 200_000) + b"]}")
    return out


async def _answers(settings: Settings, bodies: dict[str, bytes]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with serve(settings) as c:
        for name, body in bodies.items():
            r = await c.post("/fhir/predict/mortality", content=body,
                             headers={"content-type": "application/fhir+json"})
            out[name] = _essence(r)
        r = await c.post("/cds-services/scehr-mortality", json=example_cds_request())
        assert r.status_code == 200, r.text[:300]
        out["cds"] = r.json()["cards"][0]["extension"]["dev.scehr.result"]["risk"]
    return out


def _essence(r: httpx.Response) -> Any:
    """The risk of a 200; the status and rules of a refusal."""
    body = r.json()
    if r.status_code != 200:
        return r.status_code, [(p["loc"], p["rule"]) for p in body["detail"]]
    return [e["resource"]["prediction"][0]["probabilityDecimal"] for e in body["entry"]
            if e["resource"]["resourceType"] == "RiskAssessment"]


async def test_lean_and_full_give_the_same_risk_and_refusals_on_the_service(
        make_settings: Callable[..., Settings]) -> None:
    bodies = _hostile()
    lean = await _answers(make_settings(max_observations=500), bodies)
    full = await _answers(make_settings(max_observations=500, fhir_validation="full"), bodies)
    assert lean == full
    assert isinstance(lean["valid"], list) and lean["valid"]
    assert lean["unknown resourceType"][0] == 422  # was a KeyError, a 500, on the full path
    assert [s for s, *_ in (v for k, v in lean.items()
                            if k not in ("valid", "2 MB code", "cds"))] == [422] * 6
