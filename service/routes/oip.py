"""Open Inference Protocol V2 routes (`/v2/...`): health, metadata, infer.

Errors follow the protocol: a status code and `{"error": "<message>"}`. A model's name is
its task (`mortality`, `phenotypes`); its one version is the served model's version.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from schemas.contract import CONTRACT_VERSION
from schemas.payloads import ErrorBody
from service.auth import ApiKey
from service.batcher import Overloaded
from service.deps import MetricsDep, RegistryDep, SettingsDep
from service.errors import ApiError
from service.interop.oip import (
    INPUT_STAY,
    InferRequest,
    InferResponse,
    ModelMetadata,
    OipError,
    V2Error,
    metadata,
    outputs,
    plain_prepared,
    stays,
    tensor_inputs,
)
from service.pipeline import predictions, prepare
from service.registry import ModelHandle, ModelNotReady, Registry
from service.settings import Settings

router = APIRouter(prefix="/v2", tags=["open-inference-protocol"], responses={
    code: {"model": V2Error} for code in (400, 404, 503)})


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _handle(registry: Registry, name: str, version: str | None) -> ModelHandle:
    try:
        h = registry.get(name)
    except ModelNotReady as e:
        raise ApiError(503, f"model {name!r} is not ready ({e})") from None
    except KeyError:
        raise ApiError(404, f"unknown model {name!r}") from None
    if version is not None and version != h.model.spec.manifest.version:
        raise ApiError(404, f"model {name!r} has no version {version!r} "
                       f"(served: {h.model.spec.manifest.version})")
    return h


#: With API keys set, `infer` answers 401 (the service's error body) without a valid key.
KEYED: dict[int | str, dict[str, Any]] = {401: {"model": ErrorBody}}

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
        _handle(registry, name, version)
    except ApiError as e:
        return _error(400 if e.status == 503 else e.status, e.error)
    return JSONResponse({"name": name, "ready": True})


async def _model_metadata(name: str, registry: Registry, version: str | None) -> Response:
    try:
        h = _handle(registry, name, version)
    except ApiError as e:
        return _error(e.status, e.error)
    return JSONResponse(metadata(name, h.model.spec).model_dump())


def _request(raw: bytes, header_length: str | None) -> InferRequest:
    """The JSON inference request, whatever the content type (Triton clients send none)."""
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            raise OipError("Inference-Header-Content-Length is not an integer") from None
        if n != len(raw):
            raise OipError("binary tensor data is not supported: send tensors as JSON")
    try:
        return InferRequest.model_validate_json(raw)
    except ValidationError as e:
        first = e.errors(include_input=False)[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise OipError(f"not an inference request: {where or 'body'}: {first.get('msg')}") \
            from None


async def _infer(name: str, version: str | None, request: Request,
                 registry: Registry, settings: Settings, metrics: MetricsDep) -> Response:
    try:
        h = _handle(registry, name, version)
    except ApiError as e:
        return _error(e.status, e.error)
    try:
        body = _request(await request.body(),
                        request.headers.get("inference-header-content-length"))
    except OipError as e:
        return _error(400, str(e))
    request.state.model = name
    spec = h.model.spec
    given = {t.name: t for t in body.inputs}
    if len(given) != len(body.inputs):
        return _error(400, "each input name may appear once")
    try:
        if INPUT_STAY in given:
            if len(given) != 1:
                return _error(400, f"{INPUT_STAY!r} is the only input when it is given")
            t0 = time.perf_counter()
            prep = prepare(spec, stays(given[INPUT_STAY], settings.max_batch_stays),
                           max_observations=settings.max_observations)
            metrics.preprocess_seconds.labels(name).observe(time.perf_counter() - t0)
            if prep.problems:
                i, probs = next(iter(prep.problems.items()))
                p = probs[0]
                return _error(400, f"input {INPUT_STAY!r}[{i}]: "
                              f"{'.'.join(map(str, p.loc))}: {p.message} ({p.rule})")
        else:
            prep = plain_prepared(tensor_inputs(spec, given, settings.max_batch_stays),
                                  spec.fs_hash)
        assert prep.inputs is not None
        try:
            out = await h.batcher.submit(prep.inputs)
        except Overloaded:
            metrics.overload.labels(name).inc()
            return JSONResponse({"error": "too many requests queued; retry later"},
                                status_code=503,
                                headers={"Retry-After": str(settings.retry_after_s)})
        by_index = predictions(spec, prep, out)
        preds = [by_index[i] for i in range(prep.n)]
        wanted = [o.name for o in body.outputs] if body.outputs else None
        res = InferResponse(model_name=name, model_version=spec.manifest.version, id=body.id,
                            outputs=outputs(out, preds, wanted))
    except OipError as e:
        return _error(400, str(e))
    return Response(res.model_dump_json(exclude_none=True), media_type="application/json")


@router.get("/models/{name}/ready", summary="Model ready: 200, else 400")
async def model_ready(name: str, registry: RegistryDep) -> Response:
    return await _model_ready(name, registry, None)


@router.get("/models/{name}/versions/{version}/ready", summary="Model version ready")
async def model_version_ready(name: str, version: str, registry: RegistryDep) -> Response:
    return await _model_ready(name, registry, version)


@router.get("/models/{name}", response_model=ModelMetadata, summary="Model metadata")
async def model_metadata(name: str, registry: RegistryDep) -> Response:
    return await _model_metadata(name, registry, None)


@router.get("/models/{name}/versions/{version}", response_model=ModelMetadata,
            summary="Model version metadata")
async def model_version_metadata(name: str, version: str, registry: RegistryDep) -> Response:
    return await _model_metadata(name, registry, version)


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """A JSON Schema with its local `$defs` references replaced by their definitions."""
    if isinstance(node, dict):
        ref = node.get("$ref", "")
        if ref.startswith("#/$defs/"):
            return _inline(defs[ref.removeprefix("#/$defs/")], defs)
        return {k: _inline(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


_SCHEMA = InferRequest.model_json_schema()
INFER_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": _inline(_SCHEMA, _SCHEMA.get("$defs", {}))}}}}


@router.post("/models/{name}/infer", response_model=InferResponse, summary="Inference",
             openapi_extra=INFER_BODY, responses=KEYED)
async def infer(name: str, request: Request, registry: RegistryDep, settings: SettingsDep,
                metrics: MetricsDep, _: ApiKey) -> Response:
    """Tensors `x`, `lengths` (and `static`) as the graph takes them, or `stay`: BYTES of
    JSON stay payloads scored like `POST /predict/{task}`."""
    return await _infer(name, None, request, registry, settings, metrics)


@router.post("/models/{name}/versions/{version}/infer", response_model=InferResponse,
             summary="Inference on a given version", openapi_extra=INFER_BODY,
             responses=KEYED)
async def infer_version(name: str, version: str, request: Request, registry: RegistryDep,
                        settings: SettingsDep, metrics: MetricsDep, _: ApiKey) -> Response:
    return await _infer(name, version, request, registry, settings, metrics)
