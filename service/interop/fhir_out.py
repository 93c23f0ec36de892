"""FHIR R4 out: a Prediction -> a Bundle of RiskAssessment (one per class) + OperationOutcome.

Built with the `fhir.resources` models, so what is returned is valid by construction (tests
validate it again). Risk, level and words come from `service.interop.readout`.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from fhir.resources.R4B.bundle import Bundle, BundleEntry
from fhir.resources.R4B.codeableconcept import CodeableConcept
from fhir.resources.R4B.coding import Coding
from fhir.resources.R4B.extension import Extension
from fhir.resources.R4B.identifier import Identifier
from fhir.resources.R4B.operationoutcome import OperationOutcome, OperationOutcomeIssue
from fhir.resources.R4B.quantity import Quantity
from fhir.resources.R4B.range import Range
from fhir.resources.R4B.reference import Reference
from fhir.resources.R4B.riskassessment import RiskAssessment, RiskAssessmentPrediction

from schemas.manifest import Manifest
from schemas.outcomes import outcome_coding
from schemas.payloads import ClassResult, Prediction
from service.interop.fhir_in import FhirStay, Issue, expression
from service.interop.readout import QUALITATIVE, interval_of, level_of, rationale, risk_of

MODEL_SYSTEM = "urn:scehr:model"
#: The extension on `RiskAssessment.prediction` carrying the risk's uncertainty
#: (docs/interfaces.md): `probability[x]` is a choice, so the risk stays `probabilityDecimal`
#: and the interval travels beside it (`interval` valueRange, `wide` valueBoolean, `level`
#: valueDecimal, one `outcome` valueCode per outcome in the conformal set).
RISK_INTERVAL_URL = "https://scehr.dev/fhir/StructureDefinition/risk-interval"
RISK_PROBABILITY = "http://terminology.hl7.org/CodeSystem/risk-probability"
FHIR_JSON = "application/fhir+json"


def _method(pred: Prediction) -> CodeableConcept:
    m = pred.model
    return CodeableConcept(
        coding=[Coding(system=MODEL_SYSTEM, code=m.name, version=m.version,
                       display=f"{m.name} {m.version}")],
        text=f"{m.name} {m.version} (task {m.task}, loss {m.loss}, "
             f"model.onnx sha256 {m.sha256})")


def _outcome(r: ClassResult) -> CodeableConcept:
    c = outcome_coding(r.label)
    coding = [] if c is None else [Coding(system=c.system, code=c.code, display=c.display)]
    return CodeableConcept(coding=coding or None, text=r.label)


def interval_extension(r: ClassResult) -> list[Extension] | None:
    """The risk's uncertainty as the RISK_INTERVAL_URL extension (None: the model has none)."""
    ri = interval_of(r)
    if ri is None:
        return None
    parts = [Extension(url="interval", valueRange=Range(low=Quantity(value=ri.low),
                                                        high=Quantity(value=ri.high))),
             Extension(url="wide", valueBoolean=ri.wide),
             Extension(url="level", valueDecimal=ri.level),
             *(Extension(url="outcome", valueCode=o) for o in ri.outcomes)]
    return [Extension(url=RISK_INTERVAL_URL, extension=parts)]


def risk_assessment(r: ClassResult, pred: Prediction, manifest: Manifest, stay: FhirStay,
                    when: datetime, basis: list[str] | None = None) -> RiskAssessment:
    """One class result as a RiskAssessment; `basis` the references whose values the model
    read (default: every one the Bundle mapped)."""
    code, display = QUALITATIVE[level_of(r, manifest)]
    basis = stay.basis if basis is None else basis
    return RiskAssessment(
        id=str(uuid.uuid4()),
        status="final",
        identifier=[Identifier(system=MODEL_SYSTEM, value=f"{pred.model.name}:{r.label}")],
        subject=Reference(reference=stay.patient),
        encounter=Reference(reference=stay.encounter) if stay.encounter else None,
        occurrenceDateTime=when,
        method=_method(pred),
        basis=[Reference(display=b) if b.startswith("Bundle.") else Reference(reference=b)
               for b in basis] or None,
        prediction=[RiskAssessmentPrediction(
            extension=interval_extension(r),
            outcome=_outcome(r),
            probabilityDecimal=risk_of(r),
            qualitativeRisk=CodeableConcept(
                coding=[Coding(system=RISK_PROBABILITY, code=code, display=display)]),
            rationale=rationale(r, manifest),
        )],
    )


def operation_outcome(issues: list[Issue], pred: Prediction, stay: FhirStay
                      ) -> OperationOutcome | None:
    """Conversion warnings and the prediction's own warnings, as FHIR issues."""
    out = [OperationOutcomeIssue(
        severity="warning", code="informational",
        details=CodeableConcept(text=i.code), diagnostics=i.message,
        expression=[i.expression] if i.expression else None) for i in issues]
    if pred.status == "insufficient_data" and pred.sufficiency is not None:
        out.append(OperationOutcomeIssue(
            severity="warning", code="incomplete",
            details=CodeableConcept(coding=[Coding(system=MODEL_SYSTEM,
                                                   code="insufficient_data")],
                                    text="insufficient_data"),
            diagnostics=f"not enough data to estimate the risk with {pred.model.name} "
            f"{pred.model.version}: " + "; ".join(pred.sufficiency.reasons)
            + ". No RiskAssessment is given."))
    for n in pred.warnings:
        where = stay.locate(n.loc) if n.loc else None
        out.append(OperationOutcomeIssue(
            severity="warning", code="informational", details=CodeableConcept(text=n.code),
            diagnostics=n.message,
            expression=[expression(where)] if where else None))
    return OperationOutcome(id=str(uuid.uuid4()), issue=out) if out else None


def risk_bundle(pred: Prediction, manifest: Manifest, stay: FhirStay,
                when: datetime | None = None) -> Bundle:
    """The answer: a collection Bundle of RiskAssessments (+ an OperationOutcome if warned).
    A stay below the model's data minimum gets no RiskAssessment, only the OperationOutcome
    (code `incomplete`, details `insufficient_data`) naming what is missing."""
    when = when or datetime.now(UTC)
    basis = stay.contributed(pred.contributed_rows)
    entries: list[Any] = [risk_assessment(r, pred, manifest, stay, when, basis)
                          for r in pred.results]
    oo = operation_outcome(stay.issues, pred, stay)
    if oo is not None:
        entries.append(oo)
    return Bundle(type="collection", timestamp=when,
                  entry=[BundleEntry(fullUrl=f"urn:uuid:{e.id}", resource=e) for e in entries])


def to_json(resource: Any) -> str:
    """FHIR JSON text (fhir.resources' own serializer, compact, no empty elements)."""
    return resource.model_dump_json(exclude_none=True)
