"""Open Inference Protocol V2 routes (`/v2/...`): health, metadata, infer.

Errors follow the protocol: a status code and `{"error": "<message>"}`. A model's name is
its task (`mortality`, `phenotypes`); its versions are those the server loads
(SCEHR_VERSIONS), `/v2/models/{name}` being the default one.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from scehr.schemas.contract import CONTRACT_VERSION
from scehr.schemas.payloads import ErrorBody, StayPayload
from scehr.schemas.tasks import TASK_NAMES
from scehr.service.auth import ApiKey
from scehr.service.batcher import ModelInputs
from scehr.service.deps import RegistryDep, ScorerDep, SettingsDep
from scehr.service.errors import ApiError
from scehr.service.examples import infer_examples
from scehr.service.interop.oip import (
    INPUT_STAY,
    InferRequest,
    InferResponse,
    ModelMetadata,
    OipError,
    V2Error,
    metadata,
    outputs,
    stays,
    tensor_inputs,
)
from scehr.service.media_types import JSON, OPTIONAL
from scehr.service.pipeline import ModelSpec
from scehr.service.registry import ModelHandle, ModelNotReady, Registry, VersionNotServed
from scehr.service.scorer import ScoreOptions, Scorer, in_worker, released
from scehr.service.settings import Settings

router = APIRouter(prefix="/v2", tags=["open-inference-protocol"], responses={
    code: {"model": V2Error} for code in (400, 404, 503)})
#: Model metadata (versions served, tensors) is what `/models` tells: closed with it
#: (`SCEHR_OPEN_MODELS=false`).
metadata_router = APIRouter(prefix="/v2", tags=["open-inference-protocol"], responses={
    code: {"model": V2Error} for code in (400, 404, 503)})


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _handle(registry: Registry, name: str, version: str | None) -> ModelHandle:
    try:
        return registry.get(name, version)
    except ModelNotReady as e:
        raise ApiError(503, f"model {name!r} is not ready ({e})") from None
    except VersionNotServed:
        # the served versions are /models' to tell (closable): not named here
        raise ApiError(404, f"model {name!r} has no version {version!r} here") from None
    except KeyError:
        raise ApiError(404, f"unknown model {name!r}") from None


#: `infer` answers these in the service's error body, before the protocol's route runs: 401
#: without a valid key (where keys are set), 408 for a body that stalls, 413 for one over the
#: size limit (and 415, documented for every body route: `scehr.service.media_types.document`); and
#: 500 in the protocol's body when the model fails on the request's batch.
UNAUTHORIZED: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody}, 408: {"model": ErrorBody}, 413: {"model": ErrorBody},
    500: {"model": V2Error}}

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
    versions = [x.model.spec.manifest.version for x in registry.loaded(name)]
    return JSONResponse(metadata(name, h.model.spec, versions).model_dump())


def _request(raw: bytes, header_length: str | None) -> InferRequest:
    """The JSON inference request (its content type checked before: `INFER_BODY`)."""
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


def _decode(spec: ModelSpec, body: InferRequest, max_rows: int
            ) -> tuple[list[StayPayload] | None, ModelInputs | None]:
    """The request's stays (the `stay` input) or the graph's tensors; OipError when neither
    is well-formed."""
    given = {t.name: t for t in body.inputs}
    if len(given) != len(body.inputs):
        raise OipError("each input name may appear once")
    if INPUT_STAY in given:
        if len(given) != 1:
            raise OipError(f"{INPUT_STAY!r} is the only input when it is given")
        return stays(given[INPUT_STAY], max_rows), None
    return None, tensor_inputs(spec, given, max_rows)


async def _score(name: str, version: str | None, request: Request, registry: Registry,
                 settings: Settings, scorer: Scorer) -> Response:
    """Decode the request into stays (or tensors), score them with the service's scorer,
    answer its results as the protocol's tensors."""
    try:
        h = _handle(registry, name, version)
    except ApiError as e:
        return _error(e.status, e.error)
    request.state.model = name
    raw = await request.body()
    since = time.perf_counter()
    heavy = len(raw) > settings.offload_bytes
    spec = h.model.spec
    try:
        body = await in_worker(heavy, _request, raw,
                               request.headers.get("inference-header-content-length"))
        given, tensors = await in_worker(heavy, _decode, spec, body, settings.max_batch_stays)
        if given is not None:
            scored = await scorer.score(h, given, ScoreOptions(all_or_none=True), heavy=heavy,
                                        since=since)
            first = next((r for r in scored.results if r.problems), None)
            if first is not None:
                p = first.problems[0]
                return _error(400, f"input {INPUT_STAY!r}[{first.index}]: "
                              f"{'.'.join(map(str, p.loc))}: {p.message} ({p.rule})")
        else:
            assert tensors is not None
            scored = await scorer.score_tensors(h, tensors, since=since)
        assert scored.outputs is not None
        preds = [r.prediction for r in scored.results if r.prediction is not None]
        wanted = [o.name for o in body.outputs] if body.outputs else None
        res = await in_worker(heavy, lambda: InferResponse(
            model_name=name, model_version=spec.manifest.version, id=body.id,
            outputs=outputs(scored.outputs, preds, wanted)).model_dump_json(exclude_none=True))
        await released(heavy, scored.results, preds, given or [])
    except OipError as e:
        return _error(400, str(e))
    except ApiError as e:  # overload, deadline, model failure: the protocol's error body
        message = e.detail[0].message if e.detail else e.error
        return JSONResponse({"error": message}, status_code=e.status, headers=e.headers)
    return Response(res, media_type="application/json")


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
#: JSON only; a request without Content-Type is read as JSON too (Triton's client sends none;
#: `scehr.service.media_types`).
INFER_BODY = {"requestBody": {"required": True, OPTIONAL: True, "content": {JSON: {
    "schema": _inline(_SCHEMA, _SCHEMA.get("$defs", {})),
    "examples": infer_examples(TASK_NAMES[0])}}}}


@router.post("/models/{name}/infer", response_model=InferResponse, summary="Inference",
             openapi_extra=INFER_BODY, responses=UNAUTHORIZED)
async def infer(name: str, request: Request, registry: RegistryDep, settings: SettingsDep,
                scorer: ScorerDep, _: ApiKey) -> Response:
    """Tensors `x`, `lengths` (and `static`) as the graph takes them, or `stay`: BYTES of
    JSON stay payloads scored like `POST /predict/{task}`."""
    return await _score(name, None, request, registry, settings, scorer)


@router.post("/models/{name}/versions/{version}/infer", response_model=InferResponse,
             summary="Inference on a given version", openapi_extra=INFER_BODY,
             responses=UNAUTHORIZED)
async def infer_version(name: str, version: str, request: Request, registry: RegistryDep,
                        settings: SettingsDep, scorer: ScorerDep, _: ApiKey) -> Response:
    return await _score(name, version, request, registry, settings, scorer)
