"""`Annotated` dependencies shared by the routes (async: they stay on the event loop instead
of a hop through the thread pool per request)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query, Request

from scehr.schemas.payloads import Problem
from scehr.service.errors import ApiError
from scehr.service.metrics import Metrics
from scehr.service.monitoring import Monitoring
from scehr.service.registry import ModelHandle, ModelNotReady, Registry, VersionNotServed
from scehr.service.settings import Settings


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_registry(request: Request) -> Registry:
    return request.app.state.registry


async def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


async def get_monitoring(request: Request) -> Monitoring:
    return request.app.state.monitoring


#: What a model version may look like (a query or path parameter naming one).
VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+-]*$"
VersionParam = Annotated[str | None, Query(
    max_length=32, pattern=VERSION_PATTERN,
    description="A version of the task's model served here (GET /models lists them; "
    "SCEHR_VERSIONS sets them); default: the task's default")]

SettingsDep = Annotated[Settings, Depends(get_settings)]
RegistryDep = Annotated[Registry, Depends(get_registry)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
MonitoringDep = Annotated[Monitoring, Depends(get_monitoring)]


def handle_for(registry: Registry, settings: Settings, task: str,
               version: str | None = None) -> ModelHandle:
    """The model serving `task` (its `version`, default: the task's default): 404 when not
    served, 503 while it loads."""
    try:
        return registry.get(task, version)
    except VersionNotServed as e:
        raise ApiError(404, "version_not_served", [Problem(
            loc=["query", "version"], rule="version_not_served",
            message=f"{task} {version} is not served here (SCEHR_VERSIONS lists the versions "
            "a server loads)", allowed=", ".join(e.served))]) from None
    except ModelNotReady as e:
        if str(e).startswith("failed"):  # permanent until a reload or restart: no Retry-After
            raise ApiError(500, "model_failed", message=f"the {task} model failed to load; "
                           "the server's logs say why") from None
        raise ApiError(503, "model_not_ready", headers={"Retry-After": str(settings.retry_after_s)},
                       message=f"the {task} model is not ready ({e})") from None
    except KeyError:
        raise ApiError(404, "model_not_found", message="no model is served here for this "
                       "task") from None
