"""Liveness, readiness (503 until every configured model is loaded and warmed up), metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from service.deps import MetricsDep, MonitoringDep, RegistryDep

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str
    models: dict[str, str] = {}


@router.get("/livez", response_model=Health)
async def livez() -> Health:
    """The process answers (models may still be loading)."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
async def readyz(registry: RegistryDep) -> JSONResponse:
    """200 once every configured model is loaded and warmed up, else 503 with each one's state."""
    ready = registry.ready
    body = Health(status="ready" if ready else "not_ready", models=dict(registry.state))
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}}}})
async def metrics(m: MetricsDep, monitoring: MonitoringDep) -> Response:
    """Prometheus exposition (aggregated over workers in multiprocess mode)."""
    monitoring.refresh_all()
    data, content_type = m.render()
    return Response(data, media_type=content_type)
