"""Every FHIR resource read belongs to the stay, on every reader: a table of Bundle variations
from the FHIR R4 reference elements the adapter reads (Observation.subject and .encounter,
Procedure.subject, .encounter and .status, Encounter.subject and .location[].location /
.period, the Patient's id), each with its expected answer: a 422 and its rule, or a risk equal
to that of a named Bundle (the clean one, or the clean one without what must not be read) with
the warning saying what was not read. Each row runs through `POST /fhir/predict/{task}` and a
CDS Hooks prefetch, with the lean validation (the default: each Observation read once by
`scehr.service.interop.fhir_read`) and the full one (`SCEHR_FHIR_VALIDATION=full`), on a fixture
model that reads the ICU type and ventilation (physionet2012-full).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from scehr.schemas.featureset import FEATURE_SETS
from scehr.service.settings import Settings
from tests.service.conftest import serve, stay
from tests.service.fhir_writer import (
    HSLOC,
    ICU_HSLOC,
    bundle,
    cds_request,
    groups_from_stay,
    unit_and_ventilation,
)
from tests.service.fixture_model import write_index, write_model

pytestmark = pytest.mark.anyio
ADMISSION = datetime.fromisoformat("2026-03-01T06:30:00+00:00")
FHIR = {"content-type": "application/fhir+json"}
#: CDS Hooks scores with explain=full: float32 rounding may differ in the last bits.
TOL = 1e-6
#: The adapter's warnings about what does not belong (or is void), none of which a clean
#: Bundle gets.
BELONGING = {"other_encounter", "status_skipped", "location_not_referenced",
             "location_not_at_admission", "location_ambiguous", "no_effective_time"}
Change = Callable[[dict[str, Any]], Any]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("full")
    write_model(root, "mortality", "full", feature_set=FEATURE_SETS["physionet2012-full"])
    write_index(root, [("mortality", "full")])
    return root


def clean() -> dict[str, Any]:
    """Patient p1, its ICU Encounter (p1-icu) listing its surgical ICU (Location p1-unit,
    ICU type 4), the vital signs, and ventilation Procedures at hours 1-6."""
    long = stay()
    long["observations"] += [{"variable": "icu_type", "time": 0.0, "value": "4"},
                             *({"variable": "mechanical_ventilation", "time": float(h),
                                "value": 1.0} for h in range(1, 7))]
    return bundle(groups_from_stay(long), admission=ADMISSION, patient="p1",
                  extra=unit_and_ventilation(long, "p1", ADMISSION))


# ------------------------------------------------------------------ changes to a Bundle


def _all(b: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e["resource"] for e in b["entry"] if e["resource"]["resourceType"] == kind]


def _one(kind: str, i: int = 0) -> Change:
    return lambda b: _all(b, kind)[i]


_patient, _encounter, _obs, _procedure = (
    _one("Patient"), _one("Encounter"), _one("Observation"), _one("Procedure"))


def _set(get: Change, **elements: Any) -> Change:
    return lambda b: get(b).update(copy.deepcopy(elements))


def _pop(get: Change, key: str) -> Change:
    return lambda b: get(b).pop(key)


def _each(kind: str, **elements: Any) -> Change:
    return lambda b: [r.update(copy.deepcopy(elements)) for r in _all(b, kind)]


def _drop(kind: str, i: int | None = None) -> Change:
    """Leave out the resources of `kind` (its `i`-th only, when given)."""
    def change(b: dict[str, Any]) -> None:
        found = [e for e in b["entry"] if e["resource"]["resourceType"] == kind]
        gone = found if i is None else [found[i]]
        b["entry"] = [e for e in b["entry"] if all(e is not g for g in gone)]
    return change


def _both(*changes: Change) -> Change:
    return lambda b: [c(b) for c in changes]


def _unit(ident: str, icu: str) -> dict[str, Any]:
    return {"resourceType": "Location", "id": ident,
            "type": [{"coding": [{"system": HSLOC, "code": ICU_HSLOC[icu]}]}]}


def _add(resource: dict[str, Any], first: bool = False) -> Change:
    """Add a resource to the Bundle (at its end; `first`: before the stay's Location)."""
    def change(b: dict[str, Any]) -> None:
        entry = {"fullUrl": f"urn:example:{resource['resourceType']}/{resource['id']}",
                 "resource": copy.deepcopy(resource)}
        at = next(i for i, e in enumerate(b["entry"])
                  if e["resource"]["resourceType"] == "Location") if first else len(b["entry"])
        b["entry"].insert(at, entry)
    return change


def _at(hours: float) -> str:
    return (ADMISSION + timedelta(hours=hours)).isoformat().replace("+00:00", "Z")


def _period(start: float | str | None = None, end: float | None = None) -> dict[str, Any]:
    """A period in hours from the admission (a string: as written)."""
    out = {}
    if start is not None:
        out["start"] = start if isinstance(start, str) else _at(start)
    if end is not None:
        out["end"] = _at(end)
    return out


def _listed(*entries: tuple[str, dict[str, Any] | None]) -> Change:
    """Encounter.location: (Location reference, period or None) per entry."""
    return _set(_encounter, location=[
        {"location": {"reference": ref}, **({"period": p} if p is not None else {})}
        for ref, p in entries])


OTHER_PATIENT = {"reference": "Patient/someone-else"}
OTHER_ENCOUNTER = {"reference": "Encounter/an-earlier-stay"}
CCU = _unit("p1-ccu", "1")  # a coronary care unit: ICU type 1, not the clean stay's 4


@dataclass(frozen=True)
class Row:
    """A Bundle variation and what every reader answers: `refused` (the 422's rule), or 200
    with the risk of `like` (a change to the clean Bundle; None: the clean one) and the
    warning `warned` (None: no warning about belonging)."""

    change: Change
    refused: str | None = None
    like: Change | None = None
    warned: str | None = None
    #: the interfaces it applies to (a prefetch's Patient and Encounter have no fullUrl, and
    #: one key each)
    via: tuple[str, ...] = ("fhir", "cds")


ROWS: dict[str, Row] = {
    # Observation.subject, Reference(Patient | Group | Device | Location) 0..1
    "Observation.subject another patient": Row(
        _set(_obs, subject=OTHER_PATIENT), refused="fhir_subject_mismatch"),
    "Observation.subject absent": Row(
        _pop(_obs, "subject"), refused="fhir_subject_required"),
    "Observation.subject a display without a reference": Row(
        _set(_obs, subject={"display": "John"}), refused="fhir_subject_required"),
    "Observation.subject the Patient's fullUrl": Row(
        _set(_obs, subject={"reference": "urn:example:Patient/p1"}), via=("fhir",)),
    # Observation.encounter, Reference(Encounter) 0..1
    "Observation.encounter the stay's Encounter": Row(
        _set(_obs, encounter={"reference": "Encounter/p1-icu"})),
    "Observation.encounter the Encounter's fullUrl": Row(
        _set(_obs, encounter={"reference": "urn:example:Encounter/p1-icu"}), via=("fhir",)),
    "Observation.encounter the Encounter the ICU stay is partOf": Row(
        _both(_set(_encounter, partOf={"reference": "Encounter/p1-hospital"}),
              _set(_obs, encounter={"reference": "Encounter/p1-hospital"}))),
    "Observation.encounter another Encounter of the patient": Row(
        _set(_obs, encounter=OTHER_ENCOUNTER), like=_drop("Observation", 0),
        warned="other_encounter"),
    # Procedure.subject, Reference(Patient | Group) 1..1
    "Procedure.subject another patient, every Procedure": Row(
        _each("Procedure", subject=OTHER_PATIENT), refused="fhir_subject_mismatch"),
    "Procedure.subject another patient, one Procedure": Row(
        _set(_one("Procedure", 3), subject=OTHER_PATIENT), refused="fhir_subject_mismatch"),
    "Procedure.subject absent": Row(_pop(_procedure, "subject"), refused="fhir_missing"),
    # Procedure.encounter, Reference(Encounter) 0..1
    "Procedure.encounter the stay's Encounter": Row(
        _each("Procedure", encounter={"reference": "Encounter/p1-icu"})),
    "Procedure.encounter another Encounter": Row(
        _each("Procedure", encounter=OTHER_ENCOUNTER), like=_drop("Procedure"),
        warned="other_encounter"),
    # Procedure.status, required binding EventStatus
    "Procedure.status not-done": Row(
        _each("Procedure", status="not-done"), like=_drop("Procedure"), warned="status_skipped"),
    "Procedure.status entered-in-error": Row(
        _each("Procedure", status="entered-in-error"), like=_drop("Procedure"),
        warned="status_skipped"),
    # Encounter.subject, Reference(Patient | Group) 0..1
    "Encounter.subject another patient": Row(
        _set(_encounter, subject=OTHER_PATIENT), refused="fhir_subject_mismatch"),
    "Encounter.subject absent": Row(
        _pop(_encounter, "subject"), refused="fhir_subject_required"),
    # Encounter.location[].location, Reference(Location) 1..1
    "a Location the Encounter does not list, after its own": Row(
        _add(CCU), warned="location_not_referenced"),
    "a Location the Encounter does not list, before its own": Row(
        _add(CCU, first=True), warned="location_not_referenced"),
    "no Encounter.location, the Location in the Bundle": Row(
        _pop(_encounter, "location"), like=_drop("Location"),
        warned="location_not_referenced"),
    "Encounter.location names a Location the Bundle does not hold": Row(
        _listed(("Location/elsewhere", None)), like=_drop("Location"),
        warned="location_not_referenced"),
    "Encounter.location names the Location by its fullUrl": Row(
        _listed(("urn:example:Location/p1-unit", None)), via=("fhir",)),
    # Encounter.location[].period: where the patient was, when
    "the Location's period holds the admission": Row(
        _listed(("Location/p1-unit", _period(0.0, 48.0)))),
    "a second ICU Location, from a day after the admission": Row(
        _both(_add(CCU), _listed(("Location/p1-unit", _period(0.0, 24.0)),
                                 ("Location/p1-ccu", _period(24.0)))),
        warned="location_not_at_admission"),
    "a first ICU Location left at the admission": Row(
        _both(_add(CCU), _listed(("Location/p1-ccu", _period(-30.0, 0.0)),
                                 ("Location/p1-unit", _period(0.0)))),
        warned="location_not_at_admission"),
    "a Location without a period and one entered before the admission": Row(
        _both(_add(CCU), _listed(("Location/p1-ccu", None),
                                 ("Location/p1-unit", _period(-1.0)))),
        warned="location_not_at_admission"),
    "two ICU Locations of different types, no period": Row(
        _both(_add(CCU), _listed(("Location/p1-unit", None), ("Location/p1-ccu", None))),
        like=_drop("Location"), warned="location_ambiguous"),
    "the only ICU Location left before the admission": Row(
        _listed(("Location/p1-unit", _period(-30.0, -2.0))), like=_drop("Location"),
        warned="location_not_at_admission"),
    "the ICU Location's period a date without a time": Row(
        _listed(("Location/p1-unit", _period("2026-03-01"))), like=_drop("Location"),
        warned="no_effective_time"),
    # Patient.id: what the subjects name
    "Patient.id not the patient the resources name": Row(
        _set(_patient, id="p2"), refused="fhir_subject_mismatch", via=("fhir",)),
    "Patient without an id, named by its fullUrl": Row(
        _both(_pop(_patient, "id"),
              *(_each(kind, subject={"reference": "urn:example:Patient/p1"})
                for kind in ("Encounter", "Observation", "Procedure"))),
        via=("fhir",)),
    "two Patients": Row(_add({"resourceType": "Patient", "id": "p2"}),
                        refused="fhir_patient_count", via=("fhir",)),
}

#: The CDS Hooks context names the Patient and the Encounter the prefetch must hold.
CONTEXT: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "context.patientId another patient": (
        lambda r: r["context"].update(patientId="p2"), "patient_mismatch"),
    "context.encounterId another Encounter": (
        lambda r: r["context"].update(encounterId="an-earlier-stay"), "encounter_mismatch"),
}


# ------------------------------------------------------------------ answers


@dataclass
class Answer:
    status: int
    rules: list[str]
    risk: float | None = None
    warnings: frozenset[str] = frozenset()


async def fhir_answer(client: httpx.AsyncClient, b: dict[str, Any]) -> Answer:
    r = await client.post("/fhir/predict/mortality", json=b, headers=FHIR)
    body = r.json()
    if r.status_code != 200:
        return Answer(r.status_code, [p["rule"] for p in body.get("detail", [])])
    res = [e["resource"] for e in body["entry"]]
    [ra] = [x for x in res if x["resourceType"] == "RiskAssessment"]
    codes = {i["details"]["text"] for x in res if x["resourceType"] == "OperationOutcome"
             for i in x["issue"]}
    return Answer(200, [], float(ra["prediction"][0]["probabilityDecimal"]), frozenset(codes))


async def cds_answer(client: httpx.AsyncClient, request: dict[str, Any]) -> Answer:
    r = await client.post("/cds-services/scehr-mortality", json=request)
    body = r.json()
    if r.status_code != 200:
        return Answer(r.status_code, [p["rule"] for p in body.get("detail", [])])
    [card] = body["cards"]
    said = re.search(r"data warning\(s\): ([^.]*)\.", card["detail"])
    return Answer(200, [], card["extension"]["dev.scehr.result"]["risk"],
                  frozenset(said.group(1).split(", ") if said else ()))


async def answer(client: httpx.AsyncClient, via: str, b: dict[str, Any]) -> Answer:
    return await (fhir_answer(client, b) if via == "fhir" else cds_answer(client, cds_request(b)))


#: lean: the default validation; full: `fhir.resources` validates everything first.
MODES = ("lean", "full")


def _settings(models: Path, mode: str) -> Settings:
    return Settings(model_dir=models, device="cpu", fhir_validation=mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(ROWS))
async def test_every_resource_read_belongs_to_the_stay(
        name: str, mode: str, models: Path) -> None:
    row = ROWS[name]
    variant, like = clean(), clean()
    row.change(variant)
    if row.like is not None:
        row.like(like)
    async with serve(_settings(models, mode)) as client:
        for via in row.via:
            got = await answer(client, via, variant)
            if row.refused:
                assert (got.status, got.rules[:1]) == (422, [row.refused]), (via, got)
                continue
            want = await answer(client, via, like)
            assert got.status == want.status == 200, (via, got, want)
            assert got.risk is not None and want.risk is not None
            assert abs(got.risk - want.risk) <= TOL, (via, got.risk, want.risk)
            assert got.warnings - {row.warned} == want.warnings, (via, got.warnings)
            assert got.warnings & BELONGING == ({row.warned} if row.warned else set()), via


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(CONTEXT))
async def test_the_prefetch_is_the_patient_and_encounter_of_the_hooks_context(
        name: str, mode: str, models: Path) -> None:
    change, rule = CONTEXT[name]
    request = cds_request(clean())
    change(request)
    async with serve(_settings(models, mode)) as client:
        got = await cds_answer(client, request)
    assert (got.status, got.rules) == (422, [rule])


async def test_the_table_is_not_vacuous(models: Path) -> None:
    """The fixture model's risk moves with what the rows leave out (the ICU type, the
    ventilation, one heart rate): a row whose answer equals the clean one's says the
    resource was not read."""
    variants: dict[str, Change] = {"clean": lambda b: None, "no Location": _drop("Location"),
                                   "ICU type 1": _set(_one("Location"), type=CCU["type"]),
                                   "no Procedure": _drop("Procedure"),
                                   "no first Observation": _drop("Observation", 0)}
    risks = {}
    async with serve(Settings(model_dir=models, device="cpu")) as client:
        for name, change in variants.items():
            b = clean()
            change(b)
            got = await fhir_answer(client, b)
            assert got.status == 200 and not got.warnings & BELONGING, (name, got)
            risks[name] = got.risk
    assert len({round(r, 9) for r in risks.values()}) == len(risks), risks
