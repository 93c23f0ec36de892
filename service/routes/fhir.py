"""FHIR R4: `POST /fhir/predict/{task}` takes a Bundle and answers RiskAssessments."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from service.auth import ApiKey
from service.deps import MetricsDep, MonitoringDep, RegistryDep, SettingsDep, handle_for
from service.interop.fhir_in import read_bundle
from service.interop.fhir_out import FHIR_JSON, risk_bundle, to_json
from service.routes.predict import (
    ERRORS,
    AllowInsufficient,
    Explain,
    Strict,
    choose_point,
    score_one,
)

router = APIRouter(tags=["fhir"])

EXAMPLE_NOTE = "See examples/fhir_bundle.json (a synthetic stay)."


@router.post(
    "/fhir/predict/{task}", responses={**ERRORS, 200: {
        "content": {FHIR_JSON: {}},
        "description": "A collection Bundle: one RiskAssessment per class, and an "
                       "OperationOutcome listing warnings (codes not mapped, units not "
                       "convertible, cleaning) when there are any"}},
    response_class=Response, summary="Score one stay sent as a FHIR R4 Bundle")
async def fhir_predict(
    task: str,
    bundle: Annotated[dict[str, Any], Body(
        description="A FHIR R4 Bundle (collection or searchset) with one Patient, the "
        "Observations (LOINC, UCUM) and the ICU Encounter. " + EXAMPLE_NOTE,
        media_type="application/json")],
    request: Request, registry: RegistryDep, settings: SettingsDep, metrics: MetricsDep,
    monitoring: MonitoringDep, _: ApiKey, explain: Explain = "basic", strict: Strict = False,
    admission_time: Annotated[datetime | None, Query(
        description="ICU admission time (with a timezone) when the Bundle has no Encounter "
        "with period.start; overrides it otherwise")] = None,
    end_hours: Annotated[float | None, Query(
        gt=0, allow_inf_nan=False,
        description="Hours from admission to the end of the stay (whole-stay models)")] = None,
    allow_insufficient: AllowInsufficient = False,
) -> Response:
    """The Bundle becomes the same payload `POST /predict/{task}` takes and runs its path."""
    handle = handle_for(registry, settings, task)
    request.state.model = task
    # FHIR validation and building are pure Python and grow with the Bundle: off the loop
    stay = await run_in_threadpool(read_bundle, bundle, admission_time=admission_time,
                                   end_hours=end_hours, variables=handle.model.spec.fs.variables)
    choice = choose_point(handle.model.spec, None, None, allow_insufficient)
    pred = await score_one(handle, stay.payload, settings, metrics, task, explain=explain,
                           strict=strict, locate=stay.locate, monitoring=monitoring,
                           choice=choice)
    text = await run_in_threadpool(
        lambda: to_json(risk_bundle(pred, handle.model.spec.manifest, stay)))
    return Response(text, media_type=FHIR_JSON)
