"""Scoring: one stay per task, or a batch where every stay succeeds or fails on its own."""

import json
import logging
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from schemas.contract import RESPONSE_VERSION, RESPONSE_VERSION_HEADER
from schemas.payloads import (
    BatchItem,
    BatchRequest,
    BatchResponse,
    ErrorBody,
    Prediction,
    Problem,
    StayPayload,
    printable,
)
from schemas.tasks import TASK_NAMES
from service.auth import KEYED, ApiKey
from service.batcher import DeadlineExceeded, Overloaded
from service.deps import MetricsDep, MonitoringDep, RegistryDep, SettingsDep, handle_for
from service.errors import ApiError
from service.examples import (
    batch_examples,
    mortality_response,
    response_examples,
    stay_examples,
)
from service.metrics import Metrics
from service.monitoring import Monitoring
from service.operating import Choice
from service.pipeline import (
    ModelSpec,
    Prepared,
    parse_stays,
    predictions,
    prepare,
    score,
)
from service.registry import ModelHandle
from service.settings import Settings

router = APIRouter(tags=["predict"])
log = logging.getLogger("scehr.predict")
audit_log = logging.getLogger("scehr.audit")
T = TypeVar("T")
_Body = TypeVar("_Body", bound=BaseModel)

_EXPLAIN = ("basic: anchors, margin percentiles and nearest prototypes; top: also the "
            "channels contributing most to the risk (occlusion, one batched ONNX run of one "
            "row per observed channel); full: every channel's contribution")
ExplainSingle = Annotated[Literal["basic", "top", "full"], Query(description=_EXPLAIN)]
ExplainBatch = Annotated[Literal["basic", "top", "full"], Query(description=_EXPLAIN)]
Explain = ExplainSingle  # the name the FHIR and CDS Hooks routes import
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
    413: {"model": ErrorBody, "description": "Body over the size limit"},
    422: {"model": ErrorBody, "description": "Every problem: field path, rule, allowed range"},
    500: {"model": ErrorBody, "description": "The model failed (to load, or on this batch); "
          "the request id is in the server's logs"},
    503: {"model": ErrorBody, "description": "Model loading, model full, or deadline passed "
          "while queued (see Retry-After)"},
    504: {"model": ErrorBody, "description": "Deadline passed while the model computed"},
}


async def _work(heavy: bool, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
    """CPU work of a request: in a worker thread when heavy, so the event loop stays free
    (/livez, other requests' I/O); inline when light, where the hop would cost more."""
    if heavy:
        return await run_in_threadpool(fn, *args, **kw)
    return fn(*args, **kw)


def _heavy(request: Request, settings: Settings, explain: str) -> bool:
    size = request.headers.get("content-length", "")
    return explain == "full" or not size.isdigit() or int(size) > settings.offload_bytes


def _json(model: Prediction | BatchResponse) -> Response:
    """Serialize once (the route's response_model is for the schema only)."""
    return Response(model.model_dump_json(), media_type="application/json",
                    headers={RESPONSE_VERSION_HEADER: RESPONSE_VERSION})


def choose_point(spec: ModelSpec, name: str | None, threshold: float | None,
                 allow_insufficient: bool = False) -> Choice:
    """The request's operating point (and whether it scores a stay below the data minimum);
    422 naming the query parameter when it is not valid."""
    if name is not None and threshold is not None:
        raise ApiError(422, "validation_error", [Problem(
            loc=["query", "operating_point"], rule="exclusive_parameters",
            message="give `operating_point` or `threshold`, not both",
            allowed="one of operating_point, threshold")])
    if name is not None and name not in spec.points.names:
        raise ApiError(422, "validation_error", [Problem(
            loc=["query", "operating_point"], rule="unknown_operating_point",
            message=f"{spec.task} model {spec.ref.version} has no operating point {name!r}",
            allowed=", ".join(spec.points.names))])
    choice = spec.points.choose(name, threshold)
    return replace(choice, allow_insufficient=True) if allow_insufficient else choice


def _audit(spec: ModelSpec, preds: dict[int, Prediction]) -> None:
    """One structured log line per prediction: identifiers and hashes, never values."""
    for p in preds.values():
        a = p.audit
        audit_log.info("prediction", extra={
            "task": spec.task, "model_version": a.model_version,
            "model_sha256": a.model_sha256, "feature_set_hash": a.feature_set_hash,
            "operating_point": a.operating_point, "input_sha256": a.input_sha256,
            "alerts": sum(r.alert for r in p.results)})


def _count(metrics: Metrics, task: str, prep: Prepared,
           extra: list[list[Problem]] | None = None) -> None:
    """Problems by rule and notices by code: one increment per label set (a stay typically
    has several `channel_not_observed` notices; each `labels()` call takes a lock)."""
    rules = Counter(p.rule for ps in [*prep.problems.values(), *(extra or [])] for p in ps)
    for rule, k in rules.items():
        metrics.validation_errors.labels(task, rule).inc(k)
    for code, k in Counter(n.code for notes in prep.notices for n in notes).items():
        metrics.warnings.labels(task, code).inc(k)


async def _infer(handle: ModelHandle, prep: Prepared, settings: Settings, metrics: Metrics,
                 task: str, alone: Callable[[], bool] | None = None) -> Any:
    """The model's outputs for the prepared rows (None when no stay passed); `alone` as in
    `MicroBatcher.submit`."""
    if prep.inputs is None:
        return None
    retry = {"Retry-After": str(settings.retry_after_s)}
    # The deadline covers the queue wait and the compute: SCEHR_REQUEST_TIMEOUT_S per ORT run
    # the request needs (one for a stay, more for a big batch or explain=full's variants).
    runs = -(-prep.inputs.rows // handle.model.max_batch_size)
    try:
        return await handle.batcher.submit(
            prep.inputs, time.perf_counter() + settings.request_timeout_s * runs, alone)
    except Overloaded:
        metrics.overload.labels(task).inc()
        raise ApiError(503, "overloaded", headers=retry,
                       message="too many requests queued for this model; retry later") from None
    except DeadlineExceeded as e:
        if e.computing:
            raise ApiError(504, "deadline_exceeded", message=f"the model did not answer within "
                           f"{settings.request_timeout_s} s") from None
        metrics.overload.labels(task).inc()
        raise ApiError(503, "deadline_exceeded", headers=retry, message="the request waited "
                       f"{settings.request_timeout_s} s for the model; retry later") from None
    except Exception:
        log.exception("inference failed", extra={"model": task})
        raise ApiError(500, "inference_failed", message="the model failed on this request's "
                       "batch; the request id is in the server's logs") from None


def _finish(spec: ModelSpec, prep: Prepared, out: Any, choice: Choice | None, explain: str,
            monitoring: Monitoring | None) -> dict[int, Prediction]:
    """Predictions from the model's outputs, observed by monitoring and written to the audit
    log ({} when no stay passed)."""
    if out is None:
        return {}
    sc = score(spec, out)
    preds = predictions(spec, prep, out, choice=choice, explain=explain, scored=sc)
    if monitoring is not None:
        n = len(prep.ok)
        assert prep.observed is not None
        monitoring.for_spec(spec).observe(
            prep.observed, prep.values, sc.risk[:n],
            spec.points.alerts(sc.risk[:n], sc.score[:n]))
    _audit(spec, preds)
    return preds


def _prefixed(problems: list[Problem], prefix: list[str | int]) -> list[Problem]:
    return [p.model_copy(update={"loc": [*prefix, *p.loc]}) for p in problems]


def _body_loc(loc: list[str | int]) -> list[str | int]:
    return ["body", *loc]


async def score_one(handle: ModelHandle, stay: StayPayload, settings: Settings,
                    metrics: Metrics, task: str, *, explain: str = "basic",
                    strict: bool = False, heavy: bool = True,
                    locate: Callable[[list[str | int]], list[str | int]] = _body_loc,
                    choice: Choice | None = None, monitoring: Monitoring | None = None,
                    alone: Callable[[], bool] | None = None) -> Prediction:
    """The one-stay path every interface runs (JSON, FHIR, CDS Hooks, Open Inference).

    `locate` maps a payload field path to the caller's (e.g. a FHIR path) in 422 problems;
    `heavy` runs the CPU work in a worker thread, off the event loop; `choice` is the
    operating point (default: the model's), `monitoring` observes the scored stay, `alone`
    says when no other request would share its ONNX run (`MicroBatcher.submit`).
    """
    t0 = time.perf_counter()
    prep = await _work(heavy, prepare, handle.model.spec, [stay], strict=strict,
                       max_observations=settings.max_observations,
                       explain_full=explain != "basic")
    metrics.preprocess_seconds.labels(task).observe(time.perf_counter() - t0)
    _count(metrics, task, prep)
    if prep.problems:
        raise ApiError(422, "invalid_stay", [p.model_copy(update={"loc": locate(p.loc)})
                                             for p in prep.problems[0]])
    out = await _infer(handle, prep, settings, metrics, task, alone)
    return (await _work(heavy, _finish, handle.model.spec, prep, out, choice, explain,
                        monitoring))[0]


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
    return _as_body_parameter(StayPayload, raw, json.loads)


def _as_body_parameter(model: type[_Body], raw: bytes, loads: Callable[[bytes], Any]) -> _Body:
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
    itself); `StayPayload` is added to the components by `service.app.openapi_components`."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/StayPayload"},
        "examples": stay_examples(task)}}}}


def _single(task: str) -> Callable[..., Awaitable[Response]]:
    async def predict(
        request: Request, explain: ExplainSingle = "top", operating_point: PointName = None,
        threshold: Threshold = None, strict: Strict = False,
        allow_insufficient: AllowInsufficient = False,
    ) -> Response:
        # The hot path takes the app's objects from its state, not as dependencies: each
        # dependency is solved like a route of its own (~0.05 ms a request, 7 of them were 15 %
        # of this route's CPU). The API key is checked by the admission middleware, before the
        # body is read (`KEYED`: declared in the OpenAPI document all the same).
        app_state = request.app.state
        settings: Settings = app_state.settings
        request.state.model = task  # its body's errors count for the model
        heavy = _heavy(request, settings, explain)
        stay = await _work(heavy, parse_stay, await request.body())
        handle = handle_for(app_state.registry, settings, task)
        choice = choose_point(handle.model.spec, operating_point, threshold, allow_insufficient)
        return _json(await score_one(handle, stay, settings, app_state.metrics, task,
                                     explain=explain, strict=strict, heavy=heavy, choice=choice,
                                     monitoring=app_state.monitoring,
                                     alone=partial(app_state.admission.alone, task)))

    predict.__doc__ = f"Score one ICU stay with the {task} model."
    return predict


#: The task of the recorded response example (examples/*_response.json), when there is one.
_EXAMPLE_TASK = ((mortality_response() or {}).get("model") or {}).get("task")

for _task in TASK_NAMES:
    router.add_api_route(
        f"/predict/{_task}", _single(_task), methods=["POST"], response_model=Prediction,
        responses={**ERRORS, **(response_examples() if _task == _EXAMPLE_TASK else {})},
        name=f"predict_{_task}", summary=f"Score one stay ({_task})",
        operation_id=f"predict_{_task}", openapi_extra={**_stay_body(_task), **KEYED})


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
    return _as_body_parameter(BatchRequest, raw, _loads_envelope)


#: The body is read by the route (parsed off the event loop when large), so its schema and
#: examples are declared here rather than through a body parameter.
_BATCH_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": BatchRequest.model_json_schema(), "examples": batch_examples(TASK_NAMES[0])}}}}


@router.post("/predict/{task}/batch", response_model=BatchResponse,
             responses={**ERRORS, **response_examples(batch=True)},
             summary="Score many stays; each succeeds or fails on its own",
             openapi_extra=_BATCH_BODY)
async def predict_batch(
    task: str, request: Request, registry: RegistryDep, settings: SettingsDep,
    metrics: MetricsDep, monitoring: MonitoringDep, _: ApiKey, explain: ExplainBatch = "basic",
    operating_point: PointName = None, threshold: Threshold = None, strict: Strict = False,
    allow_insufficient: AllowInsufficient = False,
) -> Response:
    """Score up to SCEHR_MAX_BATCH_STAYS stays; 422 only for a malformed envelope or query."""
    handle = handle_for(registry, settings, task)
    request.state.model = task
    choice = choose_point(handle.model.spec, operating_point, threshold, allow_insufficient)
    raw = await request.body()
    body = await _work(len(raw) > settings.offload_bytes, _parse_batch, raw)
    if len(body.stays) > settings.max_batch_stays:
        metrics.validation_errors.labels(task, "too_many_stays").inc()
        raise ApiError(422, "validation_error", [Problem(
            loc=["body", "stays"], rule="too_many_stays",
            message=f"{len(body.stays)} stays; the limit is {settings.max_batch_stays}",
            allowed=f"1 to {settings.max_batch_stays} stays")])
    heavy = _heavy(request, settings, explain) or len(body.stays) > 1
    t0 = time.perf_counter()
    parsed, prep = await _work(heavy, _prepare_batch, handle.model.spec, body.stays, strict,
                               settings.max_observations, explain != "basic")
    metrics.preprocess_seconds.labels(task).observe(time.perf_counter() - t0)
    _count(metrics, task, prep, [s for s in parsed if not isinstance(s, StayPayload)])
    out = await _infer(handle, prep, settings, metrics, task)
    return await _work(heavy, _batch_response, handle.model.spec, body.stays, parsed, prep, out,
                       choice, explain, monitoring)


def _prepare_batch(spec: Any, raw: list[Any], strict: bool, max_observations: int,
                   explain_full: bool) -> tuple[list[StayPayload | list[Problem]], Prepared]:
    parsed = parse_stays(raw)
    prep = prepare(spec, [s for s in parsed if isinstance(s, StayPayload)], strict=strict,
                   max_observations=max_observations, explain_full=explain_full)
    return parsed, prep


def _batch_response(spec: Any, raw: list[Any], parsed: list[StayPayload | list[Problem]],
                    prep: Prepared, out: Any, choice: Choice, explain: str,
                    monitoring: Monitoring) -> Response:
    preds = _finish(spec, prep, out, choice, explain, monitoring)
    items: list[BatchItem] = []
    k = 0
    for i, s in enumerate(parsed):
        if not isinstance(s, StayPayload):
            raw_id = raw[i].get("id") if isinstance(raw[i], dict) else None
            sid = raw_id if isinstance(raw_id, str) and len(raw_id) <= 128 else None
            items.append(BatchItem(index=i, id=None if sid is None else printable(sid),
                                   errors=s))
            continue
        if k in preds:
            items.append(BatchItem(index=i, id=s.id, prediction=preds[k]))
        else:
            items.append(BatchItem(index=i, id=s.id, errors=_prefixed(
                prep.problems[k], ["body", "stays", i])))
        k += 1
    # Item by item: each short encoder call lets the event loop's thread take the GIL in
    # between, where one call for a response of megabytes would hold it throughout.
    parts = b",".join(item.model_dump_json().encode() for item in items)
    body = (b'{"response_version":' + json.dumps(RESPONSE_VERSION).encode() + b',"model":'
            + spec.ref.model_dump_json().encode() + b',"items":[' + parts + b"]}")
    return Response(body, media_type="application/json",
                    headers={RESPONSE_VERSION_HEADER: RESPONSE_VERSION})
