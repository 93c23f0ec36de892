"""Open Inference Protocol V2 routes (`/v2/...`): health, metadata, infer (the codec:
`service/interfaces/oip.py`).

Errors follow the protocol: a status code and `{"error": "<message>"}`. A model's name is
its task (`mortality`, `phenotypes`); its versions are those the server loads
(SCEHR_VERSIONS), `/v2/models/{name}` being the default one.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from scehr.schemas.contract import CONTRACT_VERSION
from scehr.service.deps import RegistryDep
from scehr.service.errors import ApiError
from scehr.service.interfaces.endpoint import add_scoring_route
from scehr.service.interfaces.oip import Oip, error, model_handle
from scehr.service.interop.oip import ModelMetadata, V2Error, metadata
from scehr.service.registry import Registry

router = APIRouter(prefix="/v2", tags=["open-inference-protocol"], responses={
    code: {"model": V2Error} for code in (400, 404, 503)})
#: Model metadata (versions served, tensors) is what `/models` tells: closed with it
#: (`SCEHR_OPEN_MODELS=false`).
metadata_router = APIRouter(prefix="/v2", tags=["open-inference-protocol"], responses={
    code: {"model": V2Error} for code in (400, 404, 503)})


@router.get("/health/live", summary="Server live (200) or not")
async def live() -> dict[str, bool]:
    return {"live": True}


@router.get("/health/ready", summary="Server ready: 200, else 400 with ready=false")
async def ready(registry: RegistryDep) -> JSONResponse:
    ok = registry.ready
    return JSONResponse({"ready": ok}, status_code=200 if ok else 400)


@router.get("", summary="Server metadata")
async def server_metadata() -> dict[str, object]:
    return {"name": "scehr", "version": CONTRACT_VERSION, "extensions": []}


async def _model_ready(name: str, registry: Registry, version: str | None) -> Response:
    try:
        model_handle(registry, name, version)
    except ApiError as e:
        return error(400 if e.status == 503 else e.status, e.error)
    return JSONResponse({"name": name, "ready": True})


async def _model_metadata(name: str, registry: Registry, version: str | None) -> Response:
    try:
        h = model_handle(registry, name, version)
    except ApiError as e:
        return error(e.status, e.error)
    versions = [x.model.spec.manifest.version for x in registry.loaded(name)]
    return JSONResponse(metadata(name, h.model.spec, versions).model_dump())


@router.get("/models/{name}/ready", summary="Model ready: 200, else 400")
async def model_ready(name: str, registry: RegistryDep) -> Response:
    return await _model_ready(name, registry, None)


@router.get("/models/{name}/versions/{version}/ready", summary="Model version ready")
async def model_version_ready(name: str, version: str, registry: RegistryDep) -> Response:
    return await _model_ready(name, registry, version)


@metadata_router.get("/models/{name}", response_model=ModelMetadata, summary="Model metadata")
async def model_metadata(name: str, registry: RegistryDep) -> Response:
    return await _model_metadata(name, registry, None)


@metadata_router.get("/models/{name}/versions/{version}", response_model=ModelMetadata,
            summary="Model version metadata")
async def model_version_metadata(name: str, version: str, registry: RegistryDep) -> Response:
    return await _model_metadata(name, registry, version)


add_scoring_route(router, Oip())
add_scoring_route(router, Oip(versioned=True))
