"""Hot reload behind the API key; mounted only when SCEHR_API_KEYS is set (else 404)."""

from __future__ import annotations

from fastapi import APIRouter

from scehr.schemas.payloads import ErrorBody, Problem, ReloadRequest, ReloadResponse
from scehr.schemas.tasks import TASK_NAMES
from scehr.service.auth import ApiKey
from scehr.service.deps import MetricsDep, RegistryDep
from scehr.service.errors import ApiError
from scehr.service.registry import ModelLoadError

router = APIRouter(tags=["admin"])


@router.post("/admin/models/{task}/reload", response_model=ReloadResponse,
             responses={400: {"model": ErrorBody}, 401: {"model": ErrorBody},
                        404: {"model": ErrorBody}, 413: {"model": ErrorBody},
                        422: {"model": ErrorBody}, 500: {"model": ErrorBody}})
async def reload_model(task: str, body: ReloadRequest, registry: RegistryDep,
                       metrics: MetricsDep, _: ApiKey) -> ReloadResponse:
    """Load a version, warm it up, swap it in; on any failure the old model keeps serving.

    Reaches only the worker process that receives it (each worker holds its own models).
    """
    if task not in TASK_NAMES:
        raise ApiError(404, "model_not_found", message=f"unknown task {task!r}")
    try:
        model, previous = await registry.reload(task, version=body.version, path=body.path)
    except ModelLoadError as e:
        metrics.reloads.labels(task, "rejected").inc()
        field = "version" if body.version is not None else "path"
        raise ApiError(e.status, "model_rejected", [Problem(
            loc=["body", field], rule=e.rule,
            message=f"{e} (the previous model keeps serving)")]) from None
    metrics.reloads.labels(task, "ok").inc()
    return ReloadResponse(model=model.info(), previous_version=previous)
