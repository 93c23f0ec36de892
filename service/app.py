"""The app factory: settings -> FastAPI app with its registry, batchers, metrics and routes."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from scehr.schemas.contract import CONTRACT_VERSION
from scehr.schemas.payloads import StayPayload
from scehr.service import errors, readiness
from scehr.service.auth import API_KEY_SCHEME
from scehr.service.gc_pauses import share_gil, tune_collector
from scehr.service.interop.cds_hooks import CdsRequest
from scehr.service.load_shedding import LoadShedder, LoadSheddingMiddleware
from scehr.service.logs import configure_logging
from scehr.service.media_types import body_routes, document
from scehr.service.metrics import Metrics
from scehr.service.middleware import BodyLimitMiddleware, RequestContextMiddleware
from scehr.service.monitoring import Monitoring
from scehr.service.pages import routes as pages
from scehr.service.registry import Registry
from scehr.service.routes import admin, cds_hooks, fhir, health, models, oip, predict
from scehr.service.scorer import Scorer
from scehr.service.settings import Settings

log = logging.getLogger("scehr.app")

DESCRIPTION = """ICU risk scores from SCEHR models (supervised contrastive learning with a learned
positive and negative anchor per class). Each result leads with `risk`, the calibrated
probability, and says which operating point raised its `alert`; explanations place the stay's
anchor margin among held-out stays of each outcome, name the nearest training prototypes by
their outcome rate, and rank the channels that move the risk. Responses carry
`response_version` (also the `X-Scehr-Response-Version` header) and an `audit` record.
Errors are JSON (`ErrorBody`) naming the field, the rule and the allowed range."""


def create_app(settings: Settings | None = None) -> FastAPI:
    """A new app; models load in the background at start-up (see /readyz)."""
    settings = settings or Settings()
    configure_logging(settings.log_level)
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="scehr-ort")
        registry = Registry(settings, metrics, executor)
        app.state.registry = registry
        registry.preflight()  # bad device, index, manifest or checksum: fail the start now
        registry.start()
        log.info("started", extra={"tasks": list(registry.state),
                                   "max_batch_size": settings.max_batch_size})
        try:
            yield
        finally:
            readiness.unmark(readiness.shared_folder())
            await registry.close()
            executor.shutdown(wait=True)
            Metrics.process_exit()

    common = {"title": "scehr", "version": CONTRACT_VERSION, "description": DESCRIPTION,
              "lifespan": lifespan}
    if settings.open_docs:
        # /docs and /redoc from files shipped in the fastapi-offline package: no CDN, no
        # internet (nor Swagger UI's online validator badge)
        app = FastAPIOffline(**common, swagger_ui_parameters={"validatorUrl": None})
    else:
        app = FastAPI(**common, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.load_shedder = shedder = LoadShedder(
        settings.max_queue_size, settings.request_timeout_s,
        floor=min(settings.max_queue_size, max(64, 2 * settings.max_batch_size)),
        base_retry_s=settings.retry_after_s)
    app.state.monitoring = monitoring = Monitoring(metrics, settings.monitor_window)
    app.state.scorer = Scorer(settings, metrics, monitoring, served=lambda task: [
        h.model.spec for h in app.state.registry.loaded(task)], in_flight=shedder)
    errors.install(app)
    closable_models = [models.router, cds_hooks.card_router, oip.metadata_router]
    routers = [predict.router, *(closable_models if settings.open_models else []),
               health.router, *([health.metrics_router] if settings.open_metrics else []),
               fhir.router, cds_hooks.router, oip.router,
               *([admin.router] if settings.api_keys else []),
               pages.router, *([pages.models_router] if settings.open_models else [])]
    for router in routers:
        app.include_router(router)
    openapi_components(app, StayPayload, CdsRequest)
    # Outermost last: request context, then the body-size limit (it also bounds the body that
    # load shedding reads), then keys, media types, load shedding and the body deadline.
    routes = [r for rt in routers for r in rt.routes]
    app.state.routes = routes  # the routes as declared (the pages read the scoring ones)
    app.add_middleware(LoadSheddingMiddleware, shedder=shedder, metrics=metrics,
                       timeout_s=settings.request_timeout_s,
                       api_keys=[k.get_secret_value() for k in settings.api_keys],
                       routes=routes, body_timeout_s=settings.body_timeout_s)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestContextMiddleware, metrics=metrics, bodies=body_routes(routes))
    return app


def openapi_components(app: FastAPI, *models: type[BaseModel]) -> None:
    """Add `models` (and the models they use) to the OpenAPI components: routes that read
    their body themselves (`/predict/{task}`) refer to them by `$ref`. And the 415 answer of
    every route with a body (`scehr.service.media_types.document`), and the API key's scheme that
    the scoring routes' security entry names (they declare it without a dependency:
    `scehr.service.auth.API_KEY_SECURITY`)."""
    plain = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = plain()
            document(spec)
            _, top = models_json_schema([(m, "validation") for m in models],
                                        ref_template="#/components/schemas/{model}")
            components = spec.setdefault("components", {})
            components.setdefault("securitySchemes", {}).update(API_KEY_SCHEME)
            schemas = components.setdefault("schemas", {})
            for name, schema in top.get("$defs", {}).items():
                schemas.setdefault(name, schema)
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def build_app() -> FastAPI:
    """uvicorn factory (`scehr.service.app:build_app`): settings from SCEHR_* variables; the
    worker process's collector and GIL switch interval tuned for short pauses
    (`scehr.service.gc_pauses`)."""
    settings = Settings()
    app = create_app(settings)
    share_gil(settings.gil_switch_ms)
    tune_collector()
    return app
