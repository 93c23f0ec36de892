"""FHIR R4: `POST /fhir/predict/{task}` takes a Bundle and answers RiskAssessments."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import RootModel
from starlette.concurrency import run_in_threadpool

from scehr.schemas.payloads import Problem
from scehr.service.auth import ApiKey
from scehr.service.deps import RegistryDep, ScorerDep, SettingsDep, VersionParam, handle_for
from scehr.service.errors import ApiError
from scehr.service.examples import fhir_examples
from scehr.service.interop.fhir_in import BUNDLE_TYPES, FhirStay, read_bundle
from scehr.service.interop.fhir_limits import FhirLimits, check_bundle, check_raw
from scehr.service.interop.fhir_out import FHIR_JSON, risk_bundle, to_json
from scehr.service.media_types import JSON
from scehr.service.routes.predict import (
    ERRORS,
    AllowInsufficient,
    ExplainParam,
    Strict,
    as_body_parameter,
)
from scehr.service.scorer import DEFAULT_EXPLAIN, ScoreOptions, choose_point, release

router = APIRouter(tags=["fhir"])

EXAMPLE_NOTE = "See examples/fhir_bundle.json (a synthetic stay)."
BUNDLE_NOTE = ("A FHIR R4 Bundle (collection or searchset) with one Patient, the Observations "
               "(LOINC, UCUM) and the ICU Encounter. " + EXAMPLE_NOTE)


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


def _bundle(raw: bytes, limits: FhirLimits) -> dict[str, Any]:
    """The body's Bundle as plain JSON, its size limits checked before FHIR validation."""
    check_raw(raw, limits)
    bundle = as_body_parameter(_Body, raw).root
    check_bundle(bundle, limits)
    return bundle


@router.post(
    "/fhir/predict/{task}", responses={**ERRORS, 200: {
        "content": {FHIR_JSON: {}},
        "description": "A collection Bundle: one RiskAssessment per class, and an "
                       "OperationOutcome listing warnings (codes not mapped, units not "
                       "convertible, cleaning) when there are any"}},
    response_class=Response, summary="Score one stay sent as a FHIR R4 Bundle",
    openapi_extra=BUNDLE_BODY)
async def fhir_predict(
    task: str,
    request: Request, registry: RegistryDep, settings: SettingsDep, scorer: ScorerDep,
    _: ApiKey, explain: ExplainParam = DEFAULT_EXPLAIN, strict: Strict = False,
    admission_time: Annotated[datetime | None, Query(
        description="ICU admission time (with a timezone) when the Bundle has no Encounter "
        "with period.start; overrides it otherwise")] = None,
    end_hours: Annotated[float | None, Query(
        gt=0, allow_inf_nan=False,
        description="Hours from admission to the end of the stay (whole-stay models)")] = None,
    version: VersionParam = None,
    allow_insufficient: AllowInsufficient = False,
) -> Response:
    """The Bundle becomes the stay `POST /predict/{task}` takes, scored by the same scorer."""
    handle = handle_for(registry, settings, task, version)
    request.state.model = task
    # Parsing, FHIR validation and building are pure Python and grow with the Bundle: off the
    # event loop (one worker-thread call before scoring, one after), like the rest of the
    # request's CPU work
    raw = await request.body()
    since = time.perf_counter()
    reject_xml(raw)
    variables, full = handle.model.spec.fs.variables, settings.fhir_validation == "full"

    def read() -> tuple[dict[str, Any], FhirStay]:
        bundle = _bundle(raw, FhirLimits(settings.max_observations))
        return bundle, read_bundle(bundle, admission_time=admission_time, end_hours=end_hours,
                                   variables=variables, full=full)

    bundle, stay = await run_in_threadpool(read)
    choice = choose_point(handle.model.spec, None, None, allow_insufficient)
    pred = await scorer.score_stay(handle, stay.payload, ScoreOptions(explain, strict, choice),
                                   locate=stay.locate, since=since)
    entries = bundle.get("entry")

    def answer() -> bytes:
        text = to_json(risk_bundle(pred, handle.model.spec.manifest, stay))
        release(entries if isinstance(entries, list) else [], stay.payload.columns.value,
                stay.sources, stay.refs)
        return text

    text = await run_in_threadpool(answer)
    return Response(text, media_type=FHIR_JSON)
