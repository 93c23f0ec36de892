"""FHIR R4: `POST /fhir/predict/{task}` takes a Bundle and answers RiskAssessments."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, ClassVar

from fastapi import Query
from fastapi.responses import Response
from pydantic import RootModel

from scehr.schemas.payloads import Problem
from scehr.service.errors import ApiError
from scehr.service.examples import fhir_examples
from scehr.service.interfaces.base import ERRORS, Call, Codec, Decoded, one_prediction
from scehr.service.interfaces.bodies import as_body_parameter
from scehr.service.interop.fhir_in import BUNDLE_TYPES, read_bundle
from scehr.service.interop.fhir_limits import FhirLimits, check_bundle, check_raw
from scehr.service.interop.fhir_out import FHIR_JSON, risk_bundle, to_json
from scehr.service.media_types import JSON
from scehr.service.scorer import ScoredStays

EXAMPLE_NOTE = "See examples/fhir_bundle.json (a synthetic stay)."
BUNDLE_NOTE = ("A FHIR R4 Bundle (collection or searchset) with one Patient, the Observations "
               "(LOINC, UCUM) and the ICU Encounter. " + EXAMPLE_NOTE)
#: The FHIR reader's CPU per body byte, relative to a JSON stay's (`benchmarks/codec_cost.py`:
#: 2-3x with lean validation, 17-22x with full validation, on the example and the tests'
#: Bundles). The larger counts whichever mode is set, so that a Bundle of more than a few
#: Observations is read off the event loop.
FHIR_BYTE_COST = 20.0


class _Body(RootModel[dict[str, Any]]):
    """The request body: a JSON object (the Bundle, validated resource by resource later)."""


def reject_xml(raw: bytes) -> None:
    """415 for FHIR XML sent under a JSON content type (a body that starts like XML): only
    FHIR's JSON format is read. Other content types are refused before the body is read
    (`scehr.service.media_types`)."""
    if raw.lstrip()[:1] == b"<":
        raise ApiError(415, "unsupported_media_type", [Problem(
            loc=["header", "content-type"], rule="fhir_json_only",
            message="FHIR XML is not supported: send the Bundle in FHIR's JSON format",
            allowed=f"{FHIR_JSON} or {JSON}")])


def read_body(raw: bytes, limits: FhirLimits) -> dict[str, Any]:
    """The body's Bundle as plain JSON, its size limits checked before FHIR validation."""
    check_raw(raw, limits)
    bundle = as_body_parameter(_Body, raw).root
    check_bundle(bundle, limits)
    return bundle


#: The request body in OpenAPI: a Bundle, as far as this service reads one (each resource is
#: validated with FHIR's rules once read: service/interop/fhir_in.py).
BUNDLE_SCHEMA: dict[str, Any] = {
    "title": "Bundle", "type": "object", "description": BUNDLE_NOTE,
    "required": ["resourceType", "type"], "additionalProperties": True,
    "properties": {
        "resourceType": {"const": "Bundle"},
        "type": {"enum": list(BUNDLE_TYPES)},
        "entry": {"type": "array", "items": {
            "type": "object", "additionalProperties": True, "properties": {
                "fullUrl": {"type": "string"},
                "resource": {
                    "type": "object", "required": ["resourceType"],
                    "additionalProperties": True, "properties": {"resourceType": {
                        "type": "string", "description": "A FHIR R4 resource type: "
                        "Patient, Encounter, Location, Observation and Procedure are read, "
                        "others ignored"}}}}}}}}
#: The same schema under both media types read; the example (133 kB) under FHIR's own only.
BUNDLE_BODY = {"requestBody": {"required": True, "description": BUNDLE_NOTE, "content": {
    FHIR_JSON: {"schema": BUNDLE_SCHEMA, "examples": fhir_examples()},
    JSON: {"schema": BUNDLE_SCHEMA}}}}


class Fhir(Codec):
    """A Bundle becomes the stay `POST /predict/{task}` takes; its answer a Bundle of
    RiskAssessments (and an OperationOutcome of the warnings)."""

    path = "/fhir/predict/{task}"
    name = "fhir_predict"
    route: ClassVar[Mapping[str, Any]] = {
        "responses": {**ERRORS, 200: {
            "content": {FHIR_JSON: {}},
            "description": "A collection Bundle: one RiskAssessment per class, and an "
                           "OperationOutcome listing warnings (codes not mapped, units not "
                           "convertible, cleaning) when there are any"}},
        "response_class": Response, "summary": "Score one stay sent as a FHIR R4 Bundle",
        "description": "The Bundle becomes the stay `POST /predict/{task}` takes, scored by "
        "the same scorer.",
        "openapi_extra": BUNDLE_BODY}
    params: ClassVar[Mapping[str, Any]] = {
        "admission_time": (Annotated[datetime | None, Query(
            description="ICU admission time (with a timezone) when the Bundle has no "
            "Encounter with period.start; overrides it otherwise")], None),
        "end_hours": (Annotated[float | None, Query(
            gt=0, allow_inf_nan=False,
            description="Hours from admission to the end of the stay (whole-stay models)")],
            None)}
    byte_cost = FHIR_BYTE_COST

    def decode(self, call: Call) -> Decoded:
        reject_xml(call.raw)
        bundle = read_body(call.raw, FhirLimits(call.settings.max_observations))
        stay = read_bundle(bundle, admission_time=call.values["admission_time"],
                           end_hours=call.values["end_hours"],
                           variables=call.spec.fs.variables,
                           full=call.settings.fhir_validation == "full")
        entries = bundle.get("entry")
        return Decoded([stay.payload], context=stay, heaps=(
            entries if isinstance(entries, list) else [], stay.payload.columns.value,
            stay.sources, stay.refs))

    def encode(self, call: Call, decoded: Decoded, scored: ScoredStays | None) -> Response:
        stay = decoded.context
        pred, res = one_prediction(scored, stay.locate)
        return Response(to_json(risk_bundle(pred, call.spec.manifest, stay,
                                            rows=res.contributed_rows())),
                        media_type=FHIR_JSON)
