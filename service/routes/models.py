"""The loaded models: manifest metadata, the provider really in use, test metrics."""

from __future__ import annotations

from fastapi import APIRouter

from schemas.payloads import ErrorBody, ModelInfo, ModelList, MonitoringSummary
from service.deps import MonitoringDep, RegistryDep
from service.errors import ApiError
from service.registry import ModelHandle, Registry

router = APIRouter(tags=["models"])


@router.get("/models", response_model=ModelList)
async def list_models(registry: RegistryDep) -> ModelList:
    """Models loaded in this worker, and the versions index.json offers."""
    return ModelList(models=[h.model.info() for h in registry.handles.values()],
                     available=registry.available())


@router.get("/models/{task}", response_model=ModelInfo,
            responses={404: {"model": ErrorBody}, 503: {"model": ErrorBody}})
async def get_model(task: str, registry: RegistryDep) -> ModelInfo:
    """One task's model."""
    return _handle(registry, task).model.info()


def _handle(registry: Registry, task: str) -> ModelHandle:
    h = registry.handles.get(task)
    if h is None:
        if task in registry.state:
            raise ApiError(503, "model_not_ready",
                           message=f"the {task} model is {registry.state[task]}")
        raise ApiError(404, "model_not_found", message="no model is served here for this task")
    return h


@router.get("/models/{task}/monitoring", response_model=MonitoringSummary,
            responses={404: {"model": ErrorBody}, 503: {"model": ErrorBody}})
async def get_monitoring(task: str, registry: RegistryDep,
                         monitoring: MonitoringDep) -> MonitoringSummary:
    """Drift of the last scored stays (this worker) against training and validation."""
    return monitoring.for_spec(_handle(registry, task).model.spec).refresh_gauges()
