"""The loaded models: manifest metadata, the provider really in use, test metrics."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Response

from scehr.schemas.payloads import ErrorBody, ModelInfo, ModelList, MonitoringSummary, Problem
from scehr.schemas.transparency import DOCUMENTS, document_text
from scehr.service.deps import (
    VERSION_PATTERN,
    MonitoringDep,
    RegistryDep,
    VersionParam,
    handle_for,
)
from scehr.service.errors import ApiError
from scehr.service.registry import ModelHandle, Registry

router = APIRouter(tags=["models"])
#: Not served (or that version not served), `version` malformed, still loading.
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (404, 422, 503)}


@router.get("/models", response_model=ModelList)
async def list_models(registry: RegistryDep) -> ModelList:
    """Models loaded in this worker (every served version, each task's default first), and
    the versions index.json offers."""
    return ModelList(models=[h.model.info() for t in registry.handles
                             for h in registry.loaded(t)],
                     available=registry.available())


@router.get("/models/{task}", response_model=ModelInfo,
            responses=_ERRORS)
async def get_model(task: str, registry: RegistryDep,
                    version: VersionParam = None) -> ModelInfo:
    """One task's model (its default, or a served `version`)."""
    return _handle(registry, task, version).model.info()


def _handle(registry: Registry, task: str, version: str | None = None) -> ModelHandle:
    h = registry.handles.get(task)
    if h is None:
        if task in registry.state:
            raise ApiError(503, "model_not_ready",
                           message=f"the {task} model is {registry.state[task]}")
        raise ApiError(404, "model_not_found", message="no model is served here for this task")
    return handle_for(registry, registry.settings, task, version)


@router.get("/models/{task}/monitoring", response_model=MonitoringSummary,
            responses=_ERRORS)
async def get_monitoring(task: str, registry: RegistryDep, monitoring: MonitoringDep,
                         version: VersionParam = None) -> MonitoringSummary:
    """Drift of the last scored stays (this worker) against training and validation."""
    h = _handle(registry, task, version)
    return monitoring.for_spec(h.model.spec, gauges=h.default).refresh_gauges()


@router.get("/models/{task}/{version}/transparency/{document}", responses={
    **_ERRORS, 200: {"content": {media: {} for _, media, _ in DOCUMENTS.values()}}})
async def get_transparency(
        task: str, registry: RegistryDep, document: str,
        version: Annotated[str, Path(max_length=32, pattern=VERSION_PATTERN)]) -> Response:
    """A served version's transparency document, built from its manifest: `hti1` (the 31
    HTI-1 source attributes, JSON), `chai-model-card` (CHAI applied model card, XML),
    `tripod-ai` (the TRIPOD+AI checklist mapped to the model card, JSON) or `markdown` (the
    first and third as tables)."""
    if document not in DOCUMENTS:
        raise ApiError(404, "document_not_found", [Problem(
            loc=["path", "document"], rule="unknown_document",
            message="no transparency document of this name", allowed=", ".join(DOCUMENTS))])
    manifest = _handle(registry, task, version).model.spec.manifest
    return Response(document_text(document, manifest),
                    media_type=f"{DOCUMENTS[document][1]}; charset=utf-8")
