"""FHIR R4 out: a Prediction -> a Bundle of RiskAssessment (one per class) + OperationOutcome.

Built as plain JSON objects and serialised by pydantic's encoder (the one the JSON routes use):
constructing the `fhir.resources` models cost as much as the rest of a FHIR request. The
elements are those of the FHIR R4 resources; the tests validate every shape this module
writes with `fhir.resources` and check that the models give back exactly the same JSON. Risk,
level and words come from `scehr.service.interop.readout`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic_core import to_json as encode

from scehr.schemas.manifest import Manifest
from scehr.schemas.payloads import ClassResult, ModelRef, Notice, Prediction, RiskInterval
from scehr.schemas.tasks import outcome_coding
from scehr.service.interop.fhir_in import FhirStay, Issue, expression
from scehr.service.interop.readout import QUALITATIVE, interval_of, level_of, rationale, risk_of

MODEL_SYSTEM = "urn:scehr:model"
#: The extension on `RiskAssessment.prediction` carrying the risk's uncertainty
#: (docs/interfaces.md): `probability[x]` is a choice, so the risk stays `probabilityDecimal`
#: and the interval travels beside it (`interval` valueRange, `wide` valueBoolean, `level`
#: valueDecimal, one `outcome` valueCode per outcome in the conformal set).
RISK_INTERVAL_URL = "https://scehr.dev/fhir/StructureDefinition/risk-interval"
RISK_PROBABILITY = "http://terminology.hl7.org/CodeSystem/risk-probability"
FHIR_JSON = "application/fhir+json"
Json = dict[str, Any]


def _method(m: ModelRef) -> Json:
    """The model as a RiskAssessment's `method`."""
    return {"coding": [{"system": MODEL_SYSTEM, "version": m.version, "code": m.name,
                        "display": f"{m.name} {m.version}"}],
            "text": f"{m.name} {m.version} (task {m.task}, loss {m.loss}, "
                    f"model.onnx sha256 {m.sha256})"}


def outcome_concept(label: str) -> Json:
    """A label as a RiskAssessment's `prediction.outcome`."""
    c = outcome_coding(label)
    if c is None:
        return {"text": label}
    return {"coding": [{"system": c.system, "code": c.code, "display": c.display}],
            "text": label}


def interval_extension(r: ClassResult) -> list[Json] | None:
    """The risk's uncertainty as the RISK_INTERVAL_URL extension (None: the model has none)."""
    return risk_interval_extension(interval_of(r))


def risk_interval_extension(ri: RiskInterval | None) -> list[Json] | None:
    """`interval_extension` of a risk's interval (None: none)."""
    if ri is None:
        return None
    parts = [{"url": "interval", "valueRange": {"low": {"value": ri.low},
                                                "high": {"value": ri.high}}},
             {"url": "wide", "valueBoolean": ri.wide},
             {"url": "level", "valueDecimal": ri.level},
             *({"url": "outcome", "valueCode": o} for o in ri.outcomes)]
    return [{"extension": parts, "url": RISK_INTERVAL_URL}]


def _reference(ref: str) -> Json:
    """A basis reference: a resource reference, or (a resource without id nor fullUrl) its
    place in the Bundle as a display."""
    return {"display": ref} if ref.startswith("Bundle.") else {"reference": ref}


def risk_assessment(r: ClassResult, pred: Prediction, manifest: Manifest, stay: FhirStay,
                    when: datetime, basis: list[str] | None = None) -> Json:
    """One class result as a RiskAssessment; `basis` the references whose values the model
    read (default: every one the Bundle mapped)."""
    code, display = QUALITATIVE[level_of(r, manifest)]
    basis = stay.basis if basis is None else basis
    prediction: Json = {}
    if (ext := interval_extension(r)) is not None:
        prediction["extension"] = ext
    prediction |= {"outcome": outcome_concept(r.label), "probabilityDecimal": risk_of(r),
                   "qualitativeRisk": {"coding": [{"system": RISK_PROBABILITY, "code": code,
                                                   "display": display}]},
                   "rationale": rationale(r, manifest)}
    return assessment(pred.model, f"{pred.model.name}:{r.label}", stay, when, basis,
                      prediction)


def assessment(model: ModelRef, identifier: str, stay: FhirStay, when: datetime,
               basis: list[str], prediction: Json) -> Json:
    """A RiskAssessment of the stay's patient by `model` at `when`, with one `prediction`;
    `basis`: the references whose values the model read."""
    out: Json = {"resourceType": "RiskAssessment", "id": str(uuid.uuid4()),
                 "identifier": [{"system": MODEL_SYSTEM, "value": identifier}],
                 "status": "final", "method": _method(model),
                 "subject": {"reference": stay.patient}}
    if stay.encounter:
        out["encounter"] = {"reference": stay.encounter}
    out["occurrenceDateTime"] = when
    if basis:
        out["basis"] = [_reference(b) for b in basis]
    out["prediction"] = [prediction]
    return out


def warning_issue(code: str, details: Json, diagnostics: str, where: str | None) -> Json:
    """An OperationOutcome issue of severity warning."""
    issue = {"severity": "warning", "code": code, "details": details,
             "diagnostics": diagnostics}
    return issue | {"expression": [where]} if where else issue


def operation_outcome(issues: list[Issue], pred: Prediction, stay: FhirStay) -> Json | None:
    """Conversion warnings and the prediction's own warnings, as FHIR issues."""
    incomplete = []
    if pred.status == "insufficient_data" and pred.sufficiency is not None:
        incomplete.append(warning_issue(
            "incomplete", {"coding": [{"system": MODEL_SYSTEM, "code": "insufficient_data"}],
                           "text": "insufficient_data"},
            f"not enough data to estimate the risk with {pred.model.name} "
            f"{pred.model.version}: " + "; ".join(pred.sufficiency.reasons)
            + ". No RiskAssessment is given.", None))
    return outcome_resource(issues, incomplete, pred.warnings, stay)


def outcome_resource(issues: list[Issue], incomplete: list[Json], warnings: Sequence[Notice],
                     stay: FhirStay) -> Json | None:
    """An OperationOutcome: the Bundle's conversion `issues`, the `incomplete` issues (why no
    risk was given), then the answer's `warnings` (None: nothing to say)."""
    out = [warning_issue("informational", {"text": i.code}, i.message, i.expression)
           for i in issues]
    out += incomplete
    for n in warnings:
        where = stay.locate(n.loc) if n.loc else None
        out.append(warning_issue("informational", {"text": n.code}, n.message,
                                 expression(where) if where else None))
    return {"resourceType": "OperationOutcome", "id": str(uuid.uuid4()),
            "issue": out} if out else None


def risk_bundle(pred: Prediction, manifest: Manifest, stay: FhirStay,
                when: datetime | None = None, rows: Sequence[int] | None = None) -> Json:
    """The answer: a collection Bundle of RiskAssessments (+ an OperationOutcome if warned).
    A stay below the model's data minimum gets no RiskAssessment, only the OperationOutcome
    (code `incomplete`, details `insufficient_data`) naming what is missing. `rows`: the
    payload observations whose values the model read (`StayResult.contributed_rows`), the
    RiskAssessments' basis (default: every reference the Bundle mapped)."""
    when = when or datetime.now(UTC)
    basis = stay.contributed(rows)
    entries = [risk_assessment(r, pred, manifest, stay, when, basis) for r in pred.results]
    return collection(entries, operation_outcome(stay.issues, pred, stay), when)


def collection(entries: list[Json], outcome: Json | None, when: datetime) -> Json:
    """A collection Bundle of `entries`, then `outcome` when there is one."""
    entries = entries if outcome is None else [*entries, outcome]
    bundle: Json = {"resourceType": "Bundle", "type": "collection", "timestamp": when}
    if entries:
        bundle["entry"] = [{"fullUrl": f"urn:uuid:{e['id']}", "resource": e} for e in entries]
    return bundle


def to_json(resource: Json) -> bytes:
    """FHIR JSON (compact; datetimes as ISO 8601 with `Z` for UTC, as FHIR writes them)."""
    return encode(resource)
