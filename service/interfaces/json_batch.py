"""JSON, many stays: `POST /predict/{task}/batch` takes `{"stays": [...]}` and answers one
item per stay, in input order, each a prediction or the stay's own errors."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from fastapi.responses import Response
from pydantic import BaseModel

from scehr.schemas.contract import PREVIOUS_RESPONSE_VERSION, RESPONSE_VERSION_HEADER
from scehr.schemas.payloads import (
    BatchItem,
    BatchItemV1_1,
    BatchRequest,
    BatchResponse,
    BatchResponseV1_1,
    Problem,
    StayPayload,
    printable,
)
from scehr.schemas.tasks import TASK_NAMES
from scehr.service.errors import ApiError
from scehr.service.examples import batch_examples, response_examples
from scehr.service.interfaces.base import ERRORS, Call, Codec, Decoded
from scehr.service.interfaces.bodies import as_body_parameter
from scehr.service.interfaces.options import VERSION_HEADER
from scehr.service.model import ModelSpec
from scehr.service.pipeline import parse_stays
from scehr.service.scorer import ScoredStays


def _let_the_loop_in(obj: dict[str, Any]) -> dict[str, Any]:
    """`json.loads`'s object hook, returning the object as it is: a call into Python per
    JSON object, where the interpreter may hand the GIL to another thread (it does after
    SCEHR_GIL_SWITCH_MS), so a multi-MB body decoded in a worker thread does not hold the
    event loop's thread for the whole decode (one C call without it would)."""
    return obj


def loads_envelope(raw: bytes) -> Any:
    """`json.loads` of the UTF-8 body (its errors and values: `json.loads` rather than
    pydantic's JSON parser, which refuses a whole body for one lone surrogate that the
    per-stay validation turns into that stay's error)."""
    return json.loads(raw.decode("utf-8"), object_hook=_let_the_loop_in)


def _prefixed(problems: list[Problem], prefix: list[str | int]) -> list[Problem]:
    return [p.model_copy(update={"loc": [*prefix, *p.loc]}) for p in problems]


class JsonBatch(Codec):
    """Up to SCEHR_MAX_BATCH_STAYS stays; 422 only for a malformed envelope or query."""

    path = "/predict/{task}/batch"
    name = "predict_batch"
    #: The body is read by the endpoint (parsed off the event loop when large), so its schema
    #: and examples are declared here rather than through a body parameter.
    route: ClassVar[Mapping[str, Any]] = {
        "response_model": BatchResponse | BatchResponseV1_1,
        "responses": {**ERRORS, **response_examples(batch=True)},
        "summary": "Score many stays; each succeeds or fails on its own",
        "description": "Score up to SCEHR_MAX_BATCH_STAYS stays; 422 only for a malformed "
        "envelope or query.",
        "openapi_extra": {"requestBody": {"required": True, "content": {"application/json": {
            "schema": BatchRequest.model_json_schema(),
            "examples": batch_examples(TASK_NAMES[0])}}}, **VERSION_HEADER}}
    whole = False
    versions = True

    def decode(self, call: Call) -> Decoded:
        body = as_body_parameter(BatchRequest, call.raw, loads_envelope)
        limit = call.settings.max_batch_stays
        if len(body.stays) > limit:
            call.metrics.validation_errors.labels(call.task, "too_many_stays").inc()
            raise ApiError(422, "validation_error", [Problem(
                loc=["body", "stays"], rule="too_many_stays",
                message=f"{len(body.stays)} stays; the limit is {limit}",
                allowed=f"1 to {limit} stays")])
        parsed = parse_stays(body.stays)
        valid = [s for s in parsed if isinstance(s, StayPayload)]
        refused = [s for s in parsed if not isinstance(s, StayPayload)]
        return Decoded(valid, refused, heaps=(valid, parsed, body.stays),
                       context=(body.stays, parsed))

    def encode(self, call: Call, decoded: Decoded, scored: ScoredStays | None) -> Response:
        assert scored is not None
        raw, parsed = decoded.context
        return batch_response(call.spec, raw, parsed, scored, call.options.response_version)


def batch_response(spec: ModelSpec, raw: list[Any], parsed: list[StayPayload | list[Problem]],
                   scored: ScoredStays, version: str, item_model: type[BaseModel] | None = None,
                   answer: str = "prediction") -> Response:
    """One item per input stay: its answer (the `StayResult` field `answer`, the item's field
    of the same name), or its errors (paths from the body)."""
    item_model = item_model or (BatchItemV1_1 if version == PREVIOUS_RESPONSE_VERSION
                                else BatchItem)
    items: list[BaseModel] = []
    results = iter(scored.results)
    for i, s in enumerate(parsed):
        if not isinstance(s, StayPayload):
            raw_id = raw[i].get("id") if isinstance(raw[i], dict) else None
            sid = raw_id if isinstance(raw_id, str) and len(raw_id) <= 128 else None
            items.append(item_model(index=i, id=None if sid is None else printable(sid),
                                    errors=s))
            continue
        res = next(results)
        if (got := getattr(res, answer)) is not None:
            items.append(item_model(index=i, id=s.id, **{answer: got}))
        else:
            items.append(item_model(index=i, id=s.id, errors=_prefixed(
                res.problems, ["body", "stays", i])))
    # Item by item: each short encoder call lets the event loop's thread take the GIL in
    # between, where one call for a response of megabytes would hold it throughout.
    parts = b",".join(item.model_dump_json().encode() for item in items)
    body = (b'{"response_version":' + json.dumps(version).encode() + b',"model":'
            + spec.ref.model_dump_json().encode() + b',"items":[' + parts + b"]}")
    return Response(body, media_type="application/json",
                    headers={RESPONSE_VERSION_HEADER: version})
