"""Scoring: one stay per task, or a batch where every stay succeeds or fails on its own."""

import json
import re
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from pydantic_core import from_json

from scehr.schemas.contract import (
    PREVIOUS_RESPONSE_VERSION,
    RESPONSE_VERSION,
    RESPONSE_VERSION_HEADER,
    RESPONSE_VERSIONS,
)
from scehr.schemas.payloads import (
    BatchItem,
    BatchItemV1_1,
    BatchRequest,
    BatchResponse,
    BatchResponseV1_1,
    ErrorBody,
    Prediction,
    PredictionV1_1,
    Problem,
    StayPayload,
    printable,
)
from scehr.schemas.tasks import TASK_NAMES
from scehr.service.auth import API_KEY_SECURITY, ApiKey
from scehr.service.deps import (
    MetricsDep,
    RegistryDep,
    ScorerDep,
    SettingsDep,
    VersionParam,
    handle_for,
)
from scehr.service.errors import ApiError
from scehr.service.examples import (
    batch_examples,
    mortality_response,
    response_examples,
    stay_examples,
)
from scehr.service.pipeline import ModelSpec, parse_stays
from scehr.service.query_route import QueryRoute
from scehr.service.scorer import (
    DEFAULT_EXPLAIN,
    Explain,
    ScoredStays,
    ScoreOptions,
    Scorer,
    choose_point,
    in_worker,
    released,
)
from scehr.service.settings import Settings

router = APIRouter(tags=["predict"])
_Body = TypeVar("_Body", bound=BaseModel)

_EXPLAIN = ("basic (the default): anchors, margin percentiles and nearest prototypes; top: "
            "also the 3 channels contributing most to the risk (occlusion: one more model row "
            "per observed channel, about 3x the CPU of a basic request); full: every "
            "channel's contribution")
ExplainParam = Annotated[Explain, Query(description=_EXPLAIN)]
PointName = Annotated[str | None, Query(
    max_length=64, description="A named operating point of the model (GET /models/{task} "
    "lists them, e.g. high_sensitivity, balanced, high_ppv); default: the model's default")]
Threshold = Annotated[float | None, Query(
    gt=0, lt=1, description="Your own alert threshold on the risk, instead of a named point")]
Strict = Annotated[bool, Query(description="Reject values outside the cleaning ranges "
                                           "instead of dropping or clipping them")]
AllowInsufficient = Annotated[bool, Query(description="Research use: score a stay below the "
                                          "model's data minimum anyway (with a warning) "
                                          "instead of answering status insufficient_data")]

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "The body is not parsable JSON (invalid UTF-8, "
          "numbers or nesting beyond the parser's limits)"},
    401: {"model": ErrorBody, "description": "Missing or invalid X-API-Key"},
    404: {"model": ErrorBody, "description": "Task not served"},
    408: {"model": ErrorBody, "description": "The body did not arrive within "
          "SCEHR_BODY_TIMEOUT_S (the connection is closed)"},
    413: {"model": ErrorBody, "description": "Body over the size limit"},
    422: {"model": ErrorBody, "description": "Every problem: field path, rule, allowed range"},
    500: {"model": ErrorBody, "description": "The model failed (to load, or on this batch); "
          "the request id is in the server's logs"},
    503: {"model": ErrorBody, "description": "Model loading, model full, or deadline passed "
          "while queued (see Retry-After)"},
    504: {"model": ErrorBody, "description": "Deadline passed while the model computed"},
}


#: The request header that asks for the previous response version (declared in OpenAPI; read
#: by the routes themselves, so that the single-stay route keeps `QueryRoute`'s fast path).
_VERSION_HEADER = {"parameters": [{
    "name": RESPONSE_VERSION_HEADER, "in": "header", "required": False,
    "schema": {"type": "string", "enum": list(RESPONSE_VERSIONS), "default": RESPONSE_VERSION},
    "description": f"The response version: {RESPONSE_VERSION} (the default) or "
    f"{PREVIOUS_RESPONSE_VERSION}, which adds the deprecated aliases `probability`, "
    "`calibrated_probability`, `threshold` and `prototype` to each result; "
    f"{PREVIOUS_RESPONSE_VERSION} is served in this release only"}]}


def response_version(request: Request) -> str:
    """The response version the request asks for in `RESPONSE_VERSION_HEADER` (the current
    one without it), refused as FastAPI refuses a header outside its allowed values."""
    asked = request.headers.get(RESPONSE_VERSION_HEADER)
    if asked is None or asked == RESPONSE_VERSION:
        return RESPONSE_VERSION
    if asked == PREVIOUS_RESPONSE_VERSION:
        return asked
    allowed = " or ".join(f"'{v}'" for v in RESPONSE_VERSIONS)
    raise RequestValidationError([{
        "type": "literal_error", "loc": ("header", RESPONSE_VERSION_HEADER),
        "msg": f"Input should be {allowed}: the response versions served "
        f"({PREVIOUS_RESPONSE_VERSION} for this release only)", "ctx": {"expected": allowed}}])


def heavy_request(request: Request, settings: Settings, explain: str) -> bool:
    """Whether the request's CPU work goes to a worker thread: large bodies (or of unknown
    size) and every explain=full request."""
    size = request.headers.get("content-length", "")
    return explain == "full" or not size.isdigit() or int(size) > settings.offload_bytes


def _json(model: Prediction) -> Response:
    """Serialize once (the route's response_model is for the schema only)."""
    return Response(model.model_dump_json(), media_type="application/json",
                    headers={RESPONSE_VERSION_HEADER: model.response_version})


def parse_stay(raw: bytes) -> StayPayload:
    """The stay from the request bytes. pydantic validates while it parses (one pass in Rust,
    no intermediate dict tree); a body it refuses goes through `json.loads` + validation
    instead, so every error answer is the one a FastAPI body parameter would give."""
    try:
        return StayPayload.model_validate_json(raw)
    except ValidationError:
        pass
    if not raw.strip():
        raise RequestValidationError([{"type": "missing", "loc": ("body",),
                                       "msg": "Field required"}])
    return as_body_parameter(StayPayload, raw, json.loads)


def loads_json(raw: bytes) -> Any:
    """`json.loads`'s result, faster: pydantic's JSON parser (Rust; no Python object per
    token), and `json.loads` for what that parser refuses (lone surrogates, a byte-order mark,
    UTF-16, malformed JSON), which also gives the standard errors. Whatever the Rust parser
    accepts, `json.loads` reads the same (numbers, NaN/Infinity, duplicate keys). Object keys
    come from pydantic's string cache (as `json.loads` shares a body's repeated keys): a FHIR
    Bundle repeats a few dozen keys thousands of times, and shared key objects make building,
    reading (dict look-ups by identity) and freeing the tree faster; values, which may be a
    patient's, are never cached."""
    try:
        return from_json(raw, cache_strings="keys")
    except ValueError:
        return json.loads(raw)


def as_body_parameter(model: type[_Body], raw: bytes,
                      loads: Callable[[bytes], Any] = loads_json) -> _Body:
    """`model` from the request bytes, refused exactly as FastAPI refuses a body parameter:
    422 `json_invalid` at the byte position, 400 for bytes JSON cannot hold, 422 per field."""
    try:
        obj = loads(raw)
    except json.JSONDecodeError as e:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", e.pos),
                                       "msg": "JSON decode error",
                                       "ctx": {"error": e.msg}}]) from None
    except (ValueError, RecursionError):  # invalid UTF-8, a 5,000-digit int, deep nesting
        raise HTTPException(400, "There was an error parsing the body") from None
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])}
                                      for err in e.errors(include_input=False)]) from None


def _stay_body(task: str) -> dict[str, Any]:
    """The request body of the single-stay routes in OpenAPI (the route reads the bytes
    itself); `StayPayload` is added to the components by `scehr.service.app.openapi_components`."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/StayPayload"},
        "examples": stay_examples(task)}}}}


def _single(task: str) -> Callable[..., Awaitable[Response]]:
    async def predict(
        request: Request, explain: ExplainParam = DEFAULT_EXPLAIN,
        operating_point: PointName = None, threshold: Threshold = None, strict: Strict = False,
        version: VersionParam = None, allow_insufficient: AllowInsufficient = False,
    ) -> Response:
        # The hot path takes the app's objects from its state, not as dependencies: each
        # dependency is solved like a route of its own (~0.05 ms a request, 7 of them were 15 %
        # of this route's CPU). The API key is checked by the admission middleware, before the
        # body is read (declared in the OpenAPI document all the same).
        app_state = request.app.state
        settings: Settings = app_state.settings
        request.state.model = task  # its body's errors count for the model
        answer = response_version(request)
        heavy = heavy_request(request, settings, explain)
        raw = await request.body()
        since = time.perf_counter()
        stay = await in_worker(heavy, parse_stay, raw)
        handle = handle_for(app_state.registry, settings, task, version)
        options = ScoreOptions(explain, strict, choose_point(
            handle.model.spec, operating_point, threshold, allow_insufficient),
            response_version=answer)
        scorer: Scorer = app_state.scorer
        return _json(await scorer.score_stay(handle, stay, options, heavy=heavy, since=since,
                                             alone=partial(app_state.load_shedder.alone, task)))

    predict.__doc__ = f"Score one ICU stay with the {task} model."
    return predict


#: The task of the recorded response example (examples/*_response.json), when there is one.
_EXAMPLE_TASK = ((mortality_response() or {}).get("model") or {}).get("task")

for _task in TASK_NAMES:
    router.add_api_route(
        f"/predict/{_task}", _single(_task), methods=["POST"],
        response_model=Prediction | PredictionV1_1,
        responses={**ERRORS, **(response_examples() if _task == _EXAMPLE_TASK else {})},
        name=f"predict_{_task}", summary=f"Score one stay ({_task})",
        operation_id=f"predict_{_task}",
        openapi_extra={**_stay_body(_task), **API_KEY_SECURITY, **_VERSION_HEADER},
        route_class_override=QueryRoute)


_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")


def _loads_envelope(raw: bytes) -> Any:
    """`json.loads`, but one stay at a time for the `stays` array of an object: each decode is
    a short C call, so the event loop's thread gets the GIL in between (one call on a body of
    megabytes would hold it for the whole decode). Anything unusual falls back to `json.loads`,
    which also gives the standard errors."""
    text = raw.decode("utf-8")
    try:
        i = _WS.match(text, 0).end()  # type: ignore[union-attr]
        if text[i] != "{":
            return json.loads(text)
        out: dict[str, Any] = {}
        i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
        while text[i] != "}":
            key, i = _DECODER.raw_decode(text, i)
            i = _WS.match(text, i).end()  # type: ignore[union-attr]
            if text[i] != ":" or not isinstance(key, str):
                return json.loads(text)
            i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
            if key == "stays" and text[i] == "[":
                items: list[Any] = []
                i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
                while text[i] != "]":
                    item, i = _DECODER.raw_decode(text, i)
                    items.append(item)
                    i = _WS.match(text, i).end()  # type: ignore[union-attr]
                    if text[i] == ",":
                        i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
                        if text[i] == "]":  # a trailing comma
                            return json.loads(text)
                    elif text[i] != "]":
                        return json.loads(text)
                value, i = items, i + 1
            else:
                value, i = _DECODER.raw_decode(text, i)
            out[key] = value
            i = _WS.match(text, i).end()  # type: ignore[union-attr]
            if text[i] == ",":
                i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
                if text[i] == "}":  # a trailing comma
                    return json.loads(text)
            elif text[i] != "}":
                return json.loads(text)
        if text[i + 1 :].strip(" \t\n\r"):
            return json.loads(text)
        return out
    except (IndexError, json.JSONDecodeError):
        return json.loads(text)


def _parse_batch(raw: bytes) -> BatchRequest:
    """The envelope from the bytes, answered as FastAPI would for a body parameter. `json.loads`
    rather than pydantic's JSON parser, which refuses a whole body for one lone surrogate that
    the per-stay validation turns into that stay's error."""
    return as_body_parameter(BatchRequest, raw, _loads_envelope)


#: The body is read by the route (parsed off the event loop when large), so its schema and
#: examples are declared here rather than through a body parameter.
_BATCH_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": BatchRequest.model_json_schema(), "examples": batch_examples(TASK_NAMES[0])}}},
    **_VERSION_HEADER}


@router.post("/predict/{task}/batch", response_model=BatchResponse | BatchResponseV1_1,
             responses={**ERRORS, **response_examples(batch=True)},
             summary="Score many stays; each succeeds or fails on its own",
             openapi_extra=_BATCH_BODY)
async def predict_batch(
    task: str, request: Request, registry: RegistryDep, settings: SettingsDep,
    metrics: MetricsDep, scorer: ScorerDep, _: ApiKey, explain: ExplainParam = DEFAULT_EXPLAIN,
    operating_point: PointName = None, threshold: Threshold = None, strict: Strict = False,
    version: VersionParam = None, allow_insufficient: AllowInsufficient = False,
) -> Response:
    """Score up to SCEHR_MAX_BATCH_STAYS stays; 422 only for a malformed envelope or query."""
    handle = handle_for(registry, settings, task, version)
    request.state.model = task
    options = ScoreOptions(explain, strict, choose_point(
        handle.model.spec, operating_point, threshold, allow_insufficient),
        response_version=response_version(request))
    raw = await request.body()
    since = time.perf_counter()
    body = await in_worker(len(raw) > settings.offload_bytes, _parse_batch, raw)
    if len(body.stays) > settings.max_batch_stays:
        metrics.validation_errors.labels(task, "too_many_stays").inc()
        raise ApiError(422, "validation_error", [Problem(
            loc=["body", "stays"], rule="too_many_stays",
            message=f"{len(body.stays)} stays; the limit is {settings.max_batch_stays}",
            allowed=f"1 to {settings.max_batch_stays} stays")])
    heavy = heavy_request(request, settings, explain) or len(body.stays) > 1
    parsed = await in_worker(heavy, parse_stays, body.stays)
    valid = [s for s in parsed if isinstance(s, StayPayload)]
    scored = await scorer.score(handle, valid, options, heavy=heavy, since=since,
                                refused=[s for s in parsed if not isinstance(s, StayPayload)])
    response = await in_worker(heavy, _batch_response, handle.model.spec, body.stays, parsed,
                               scored, options.response_version)
    await released(heavy, scored.results, valid, parsed, body.stays)
    return response


def _prefixed(problems: list[Problem], prefix: list[str | int]) -> list[Problem]:
    return [p.model_copy(update={"loc": [*prefix, *p.loc]}) for p in problems]


def _batch_response(spec: ModelSpec, raw: list[Any], parsed: list[StayPayload | list[Problem]],
                    scored: ScoredStays, version: str = RESPONSE_VERSION) -> Response:
    item_model = BatchItemV1_1 if version == PREVIOUS_RESPONSE_VERSION else BatchItem
    items: list[BatchItem] = []
    results = iter(scored.results)
    for i, s in enumerate(parsed):
        if not isinstance(s, StayPayload):
            raw_id = raw[i].get("id") if isinstance(raw[i], dict) else None
            sid = raw_id if isinstance(raw_id, str) and len(raw_id) <= 128 else None
            items.append(item_model(index=i, id=None if sid is None else printable(sid),
                                    errors=s))
            continue
        res = next(results)
        if res.prediction is not None:
            items.append(item_model(index=i, id=s.id, prediction=res.prediction))
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
