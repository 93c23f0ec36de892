"""CDS Hooks 2.0 routes (`/cds-services`) and the model card they link to."""

from __future__ import annotations

import time
from collections.abc import Sequence

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from scehr.schemas.payloads import ErrorBody
from scehr.schemas.variables import CATALOG, Variable
from scehr.service.auth import ApiKey
from scehr.service.deps import RegistryDep, ScorerDep, SettingsDep, VersionParam, handle_for
from scehr.service.errors import ApiError
from scehr.service.examples import cds_examples
from scehr.service.interop.cds_hooks import (
    SERVICE_PREFIX,
    CdsDiscovery,
    CdsRequest,
    CdsResponse,
    cards,
    discovery,
    model_card_url,
    read_prefetch,
)
from scehr.service.interop.fhir_limits import FhirLimits, check_raw
from scehr.service.registry import ModelNotReady, Registry
from scehr.service.routes.predict import ERRORS, as_body_parameter
from scehr.service.scorer import ScoreOptions

router = APIRouter(tags=["cds-hooks"])
#: The model card tells the served version, its checksums and metrics: served with /models
#: (closed by `SCEHR_OPEN_MODELS=false`, like them).
card_router = APIRouter(tags=["cds-hooks"])


@router.get("/cds-services", response_model=CdsDiscovery,
            summary="CDS Hooks discovery: one patient-view service per served task")
async def cds_discovery(registry: RegistryDep) -> CdsDiscovery:
    return discovery({t: _variables(registry, t) for t in sorted(registry.state)})


def _variables(registry: Registry, task: str) -> Sequence[Variable]:
    """The variables the task's model reads; the whole catalog while it is not ready (the
    prefetch then asks for more than it will use, and the unused codes are warnings)."""
    try:
        return registry.get(task).model.spec.fs.variables
    except (KeyError, ModelNotReady):
        return CATALOG


def _cds_request(raw: bytes, limits: FhirLimits) -> CdsRequest:
    """The request, its size limits checked before FHIR validation (`fhir_limits`)."""
    check_raw(raw, limits)
    return as_body_parameter(CdsRequest, raw)


@router.post("/cds-services/{service_id}", response_model=CdsResponse,
             response_model_exclude_none=True,
             responses={**ERRORS, 412: {"model": ErrorBody, "description":
                        "A required prefetch key is missing or null (this service cannot "
                        "query a FHIR server)"}},
             summary="CDS Hooks patient-view: risk cards from the prefetched data",
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": {"$ref": "#/components/schemas/CdsRequest"},
                                      "examples": cds_examples()}}}})
async def cds_service(service_id: str, request: Request,
                      registry: RegistryDep, settings: SettingsDep, scorer: ScorerDep,
                      _: ApiKey, version: VersionParam = None) -> CdsResponse:
    """Cards by operating point (info / warning / critical), with the top contributing
    variables (occlusion) and a link to the model card."""
    if not service_id.startswith(SERVICE_PREFIX):
        raise ApiError(404, "service_not_found", message=f"no CDS service {service_id!r}")
    task = service_id.removeprefix(SERVICE_PREFIX)
    handle = handle_for(registry, settings, task, version)
    request.state.model = task
    # Parsing and FHIR validation grow with the prefetch: off the event loop
    raw = await request.body()
    since = time.perf_counter()
    body = await run_in_threadpool(_cds_request, raw, FhirLimits(settings.max_observations))
    stay = await run_in_threadpool(read_prefetch, body, handle.model.spec.fs.variables,
                                   settings.fhir_validation == "full")
    if stay is None:  # the client has no Observations: no decision support to give
        return CdsResponse(cards=[])
    pred = await scorer.score_stay(handle, stay.payload, ScoreOptions(explain="full"),
                                   locate=stay.locate, since=since)
    return cards(pred, handle.model.spec.manifest, model_card_url(
        settings.public_base_url if settings.open_models else None, task), stay.issues)


@card_router.get("/models/{task}/card", response_class=PlainTextResponse, name="model_card",
            responses={200: {"content": {"text/markdown": {}}},
                       404: {"content": {"application/json": {
                           "schema": {"$ref": "#/components/schemas/ErrorBody"}}}}},
            summary="The served model's card (Markdown)")
async def model_card(task: str, registry: RegistryDep, settings: SettingsDep) -> Response:
    handle = handle_for(registry, settings, task)
    path = handle.model.path / "MODEL_CARD.md"
    if not path.is_file():
        raise ApiError(404, "model_card_not_found",
                       message=f"the {task} model ships no MODEL_CARD.md")
    return Response(path.read_text(), media_type="text/markdown; charset=utf-8")
