"""The pages under /ui/: model facts, a stay, monitoring, and their two static files.

Openness follows the API's: the facts and monitoring pages show what `/models...` shows, so
they exist only with SCEHR_OPEN_MODELS (as `/models/{task}/monitoring`), and latency only with
SCEHR_OPEN_METRICS (as `/metrics`). The stay page is always there; the route it scores through
needs the API key whenever `POST /predict/{task}` does (`scehr.service.pages.stay`).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response

from scehr.schemas.contract import CONTRACT_VERSION
from scehr.service.deps import MetricsDep, MonitoringDep, RegistryDep, SettingsDep, handle_for
from scehr.service.errors import ApiError
from scehr.service.interfaces.endpoint import add_scoring_route
from scehr.service.pages.facts import FactsCache, build_facts
from scehr.service.pages.monitor_view import (
    QUANTILES,
    drift_chart,
    latencies,
    observation_chart,
    scoring_endpoints,
)
from scehr.service.pages.render import SECURITY_HEADERS, STATIC, page, render
from scehr.service.pages.risk_over_time import PageTrajectory
from scehr.service.pages.stay import PageStay
from scehr.service.registry import Registry
from scehr.service.settings import Settings

#: Seconds between refreshes of the monitoring page.
REFRESH_SECONDS = 15
#: The static files served, by name: nothing else under /ui/static/ exists.
STATIC_FILES = {"pages.css": "text/css", "stay.js": "text/javascript",
                "favicon.svg": "image/svg+xml"}

router = APIRouter(include_in_schema=False)  # the stay page, its scoring route, static files
models_router = APIRouter(include_in_schema=False)  # closable: SCEHR_OPEN_MODELS=false
add_scoring_route(router, PageStay())
add_scoring_route(router, PageTrajectory())


def _common(request: Request, settings: Settings) -> dict[str, Any]:
    return {"base": request.scope.get("root_path", "").rstrip("/"),
            "open_models": settings.open_models, "open_docs": settings.open_docs,
            "contract": CONTRACT_VERSION}


@router.get("/ui/static/{name}")
async def static_file(name: str) -> Response:
    if name not in STATIC_FILES:
        raise ApiError(404, "not_found", message="no such file")
    return FileResponse(STATIC / name, media_type=STATIC_FILES[name],
                        headers={"X-Content-Type-Options": "nosniff"})


@router.get("/ui/stay", response_class=HTMLResponse)
async def stay_page(request: Request, registry: RegistryDep, settings: SettingsDep) -> Response:
    """The form: a stay or a Bundle in, the answer drawn by `POST /ui/stay/{task}`."""
    tasks = sorted(registry.state)
    return page(render("stay.html", tasks=tasks, needs_key=bool(settings.api_keys),
                       **_common(request, settings)))


@router.get("/ui")
async def ui_root(settings: SettingsDep) -> Response:
    return RedirectResponse("ui/" if settings.open_models else "ui/stay", status_code=307)


def _headline(metrics: dict[str, Any]) -> dict[str, Any] | None:
    name = (metrics.get("test") or {}).get("headline")
    ci = (metrics.get("test_ci") or {}).get(name)
    if not isinstance(ci, dict):
        return None
    return {"name": name, "value": ci.get("value"), "low": ci.get("low"), "high": ci.get("high")}


@models_router.get("/ui/", response_class=HTMLResponse)
async def index_page(request: Request, registry: RegistryDep, settings: SettingsDep
                     ) -> Response:
    """Every loaded version, linking to its facts."""
    models = [{"task": t, "name": h.model.spec.manifest.name,
               "version": h.model.spec.manifest.version, "default": h.default,
               "headline": _headline(h.model.spec.manifest.metrics)}
              for t in sorted(registry.handles) for h in registry.loaded(t)]
    return page(render("index.html", models=models, **_common(request, settings)))


def _facts_cache(request: Request) -> FactsCache:
    state = request.app.state
    if getattr(state, "facts_cache", None) is None:
        state.facts_cache = FactsCache()
    return state.facts_cache


@models_router.get("/ui/models/{task}/{version}", response_class=HTMLResponse)
async def facts_page(task: str, version: str, request: Request, registry: RegistryDep,
                     settings: SettingsDep) -> Response:
    """The facts of a served version, rendered once per model and kept."""
    h = handle_for(registry, settings, task, version)
    spec = h.model.spec
    common = _common(request, settings)
    key = (task, version, spec.ref.sha256, h.default, *common.values())
    html = _facts_cache(request).get(key, lambda: render(
        "facts.html", f=build_facts(spec.manifest, spec.ref.sha256, h.default), **common))
    return page(html)


def _monitor_rows(registry: Registry, monitoring: Any) -> list[dict[str, Any]]:
    rows = []
    for t in sorted(registry.handles):
        for k, h in enumerate(registry.loaded(t)):
            s = monitoring.for_spec(h.model.spec, gauges=h.default).refresh_gauges()
            ident = f"{t}-{k}"
            rows.append({"summary": s, "default": h.default,
                         "drift": drift_chart(s, f"drift-{ident}"),
                         "observed": observation_chart(s, f"observed-{ident}")})
    return rows


@models_router.get("/ui/monitoring", response_class=HTMLResponse)
async def monitoring_page(request: Request, registry: RegistryDep, settings: SettingsDep,
                          monitoring: MonitoringDep, metrics: MetricsDep) -> Response:
    """This worker's monitor of every loaded version, and latency (with open metrics)."""
    rows = _monitor_rows(registry, monitoring)
    latency = (latencies(metrics, sorted(registry.handles),
                         scoring_endpoints(request.app.state.routes))
               if settings.open_metrics else None)
    return page(render("monitoring.html", rows=rows, latency=latency, quantiles=QUANTILES,
                       refresh=REFRESH_SECONDS, pid=os.getpid(),
                       now=datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
                       **_common(request, settings)))


__all__ = ["SECURITY_HEADERS", "models_router", "router"]
