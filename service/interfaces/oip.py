"""Open Inference Protocol V2: `POST /v2/models/{name}[/versions/{version}]/infer` takes the
graph's own tensors, or `stay` (BYTES of JSON stay payloads), and answers tensors.

Errors follow the protocol: a status code and `{"error": "<message>"}`. A model's name is its
task; its versions are those the server loads (SCEHR_VERSIONS), `/v2/models/{name}` being the
default one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from scehr.schemas.payloads import ErrorBody, StayPayload
from scehr.schemas.tasks import TASK_NAMES
from scehr.service.batcher import ModelInputs
from scehr.service.errors import ApiError
from scehr.service.examples import infer_examples
from scehr.service.interfaces.base import Call, Codec, Decoded
from scehr.service.interop.oip import (
    INPUT_STAY,
    InferRequest,
    InferResponse,
    OipError,
    V2Error,
    outputs,
    stays,
    tensor_inputs,
)
from scehr.service.media_types import JSON, OPTIONAL
from scehr.service.model import ModelSpec
from scehr.service.registry import ModelHandle, ModelNotReady, Registry, VersionNotServed
from scehr.service.scorer import ScoredStays
from scehr.service.settings import Settings

#: `infer` answers these in the service's error body, before the protocol's route runs: 401
#: without a valid key (where keys are set), 408 for a body that stalls, 413 for one over the
#: size limit (and 415, documented for every body route: `scehr.service.media_types.document`); and
#: 500 in the protocol's body when the model fails on the request's batch.
UNAUTHORIZED: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody}, 408: {"model": ErrorBody}, 413: {"model": ErrorBody},
    500: {"model": V2Error}}


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The protocol's error answer."""
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def model_handle(registry: Registry, name: str, version: str | None) -> ModelHandle:
    """The model `name` (a task) at `version` (default: the task's default), or `ApiError`
    with the protocol's message."""
    try:
        return registry.get(name, version)
    except ModelNotReady as e:
        raise ApiError(503, f"model {name!r} is not ready ({e})") from None
    except VersionNotServed:
        # the served versions are /models' to tell (closable): not named here
        raise ApiError(404, f"model {name!r} has no version {version!r} here") from None
    except KeyError:
        raise ApiError(404, f"unknown model {name!r}") from None


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


def infer_request(raw: bytes, header_length: str | None) -> InferRequest:
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


def inputs_of(spec: ModelSpec, body: InferRequest, max_rows: int
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


class Oip(Codec):
    """Tensors `x`, `lengths` (and `static`) as the graph takes them, or `stay`: BYTES of
    JSON stay payloads scored like `POST /predict/{task}`. No query options: the protocol
    carries none (a version is in the path)."""

    options = ()

    def __init__(self, versioned: bool = False) -> None:
        # under the V2 router's prefix (/v2), which adds the protocol's 400, 404 and 503
        self.path = "/models/{name}" + ("/versions/{version}" if versioned else "") + "/infer"
        self.name = "infer_version" if versioned else "infer"
        self.route = {
            "response_model": InferResponse, "responses": UNAUTHORIZED,
            "summary": "Inference on a given version" if versioned else "Inference",
            "description": "" if versioned else "Tensors `x`, `lengths` (and `static`) as "
            "the graph takes them, or `stay`: BYTES of\nJSON stay payloads scored like "
            "`POST /predict/{task}`.",
            "openapi_extra": INFER_BODY}

    def task(self, path: Mapping[str, Any]) -> str | None:
        return path.get("name")

    def handle(self, registry: Registry, settings: Settings, task: str,
               version: str | None) -> ModelHandle:
        return model_handle(registry, task, version)

    def decode(self, call: Call) -> Decoded:
        body = infer_request(call.raw, call.request.headers.get("inference-header-content-length"))
        given, tensors = inputs_of(call.spec, body, call.settings.max_batch_stays)
        return Decoded(given or [], tensors=tensors, heaps=(given or [],), context=body)

    def encode(self, call: Call, decoded: Decoded, scored: ScoredStays | None) -> Response:
        assert scored is not None
        first = next((r for r in scored.results if r.problems), None)
        if first is not None:
            p = first.problems[0]
            return error(400, f"input {INPUT_STAY!r}[{first.index}]: "
                         f"{'.'.join(map(str, p.loc))}: {p.message} ({p.rule})")
        assert scored.outputs is not None
        body: InferRequest = decoded.context
        preds = [r.prediction for r in scored.results if r.prediction is not None]
        wanted = [o.name for o in body.outputs] if body.outputs else None
        return Response(InferResponse(
            model_name=call.task, model_version=call.spec.manifest.version, id=body.id,
            outputs=outputs(scored.outputs, preds, wanted)).model_dump_json(exclude_none=True),
            media_type="application/json")

    def refusal(self, e: Exception) -> Response | None:
        if isinstance(e, OipError):
            return error(400, str(e))
        if isinstance(e, ApiError):  # overload, deadline, model failure, model not served
            return error(e.status, e.detail[0].message if e.detail else e.error, e.headers)
        return None
