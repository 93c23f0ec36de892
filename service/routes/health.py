"""Liveness, readiness (503 until every configured model is loaded and warmed up), metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from scehr.service import readiness
from scehr.service.deps import MetricsDep, MonitoringDep, RegistryDep

router = APIRouter(tags=["health"])
metrics_router = APIRouter(tags=["health"])  # closable: SCEHR_OPEN_METRICS=false


class Health(BaseModel):
    status: str
    models: dict[str, str] = {}
    workers: str | None = None


@router.get("/livez", response_model=Health, response_model_exclude_none=True)
async def livez() -> Health:
    """The process answers (models may still be loading)."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
async def readyz(registry: RegistryDep) -> JSONResponse:
    """200 once every configured model is loaded and warmed up in every worker process, else
    503 with each model's state and how many workers are ready."""
    ready, workers = readiness.all_workers_ready(readiness.shared_folder(),
                                                 registry.settings.workers, registry.ready)
    body = Health(status="ready" if ready else "not_ready", models=dict(registry.state),
                  workers=workers)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


@metrics_router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}}}})
async def metrics(m: MetricsDep, monitoring: MonitoringDep) -> Response:
    """Prometheus exposition (aggregated over workers in multiprocess mode), rendered in a
    worker thread so a large scrape never stalls the event loop."""
    def render() -> tuple[bytes, str]:
        monitoring.refresh_all()
        return m.render()

    data, content_type = await run_in_threadpool(render)
    return Response(data, media_type=content_type)
