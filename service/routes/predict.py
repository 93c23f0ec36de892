"""Scoring: one stay per task, or a batch where every stay succeeds or fails on its own."""

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.responses import Response

from schemas.contract import RESPONSE_VERSION, RESPONSE_VERSION_HEADER
from schemas.payloads import (
    BatchItem,
    BatchRequest,
    BatchResponse,
    ErrorBody,
    Prediction,
    Problem,
    StayPayload,
)
from service.auth import ApiKey
from service.batcher import Overloaded
from service.deps import MetricsDep, MonitoringDep, RegistryDep, SettingsDep, handle_for
from service.errors import ApiError
from service.examples import batch_examples, response_examples, stay_examples
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
audit_log = logging.getLogger("scehr.audit")

_EXPLAIN = ("basic: anchors, margin percentiles and nearest prototypes; top: also the "
            "channels contributing most to the risk (occlusion, one batched ONNX run of one "
            "row per observed channel); full: every channel's contribution")
ExplainSingle = Annotated[Literal["basic", "top", "full"], Query(description=_EXPLAIN)]
ExplainBatch = Annotated[Literal["basic", "top", "full"], Query(description=_EXPLAIN)]
PointName = Annotated[str | None, Query(
    max_length=64, description="A named operating point of the model (GET /models/{task} "
    "lists them, e.g. high_sensitivity, balanced, high_ppv); default: the model's default")]
Threshold = Annotated[float | None, Query(
    gt=0, lt=1, description="Your own alert threshold on the risk, instead of a named point")]
Strict = Annotated[bool, Query(description="Reject values outside the cleaning ranges "
                                           "instead of dropping or clipping them")]

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing or invalid X-API-Key"},
    404: {"model": ErrorBody, "description": "Task not served"},
    413: {"model": ErrorBody, "description": "Body over the size limit"},
    422: {"model": ErrorBody, "description": "Every problem: field path, rule, allowed range"},
    503: {"model": ErrorBody, "description": "Model loading or queue full (see Retry-After)"},
}


def _json(model: Prediction | BatchResponse) -> Response:
    """Serialize once (the route's response_model is for the schema only)."""
    return Response(model.model_dump_json(), media_type="application/json",
                    headers={RESPONSE_VERSION_HEADER: RESPONSE_VERSION})


def choose_point(spec: ModelSpec, name: str | None, threshold: float | None) -> Choice:
    """The request's operating point; 422 naming the query parameter when it is not valid."""
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
    return spec.points.choose(name, threshold)


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
    for problems in [*prep.problems.values(), *(extra or [])]:
        for p in problems:
            metrics.validation_errors.labels(task, p.rule).inc()
    for notes in prep.notices:
        for n in notes:
            metrics.warnings.labels(task, n.code).inc()


async def _infer(handle: ModelHandle, prep: Prepared, settings: Settings,
                 metrics: Metrics, task: str, monitoring: Monitoring, choice: Choice,
                 explain: str) -> dict[int, Prediction]:
    if prep.inputs is None:
        return {}
    try:
        out = await handle.batcher.submit(prep.inputs)
    except Overloaded:
        metrics.overload.labels(task).inc()
        raise ApiError(503, "overloaded", headers={"Retry-After": str(settings.retry_after_s)},
                       message="too many requests queued for this model; retry later") from None
    spec = handle.model.spec
    sc = score(spec, out)
    preds = predictions(spec, prep, out, choice=choice, explain=explain, scored=sc)
    n = len(prep.ok)
    assert prep.observed is not None
    monitoring.for_spec(spec).observe(
        prep.observed, prep.values, sc.risk[:n],
        spec.points.alerts(sc.risk[:n], sc.score[:n]))
    _audit(spec, preds)
    return preds


def _prefixed(problems: list[Problem], prefix: list[str | int]) -> list[Problem]:
    return [p.model_copy(update={"loc": [*prefix, *p.loc]}) for p in problems]


def _single(task: str) -> Callable[..., Awaitable[Response]]:
    async def label(request: Request) -> None:  # runs even when the body fails validation
        request.state.model = task

    async def predict(
        stay: Annotated[StayPayload, Body(openapi_examples=stay_examples(task))],
        request: Request, registry: RegistryDep, settings: SettingsDep, metrics: MetricsDep,
        monitoring: MonitoringDep, _: ApiKey, __: Annotated[None, Depends(label)],
        explain: ExplainSingle = "top", operating_point: PointName = None,
        threshold: Threshold = None, strict: Strict = False,
    ) -> Response:
        handle = handle_for(registry, settings, task)
        choice = choose_point(handle.model.spec, operating_point, threshold)
        t0 = time.perf_counter()
        prep = prepare(handle.model.spec, [stay], strict=strict,
                       max_observations=settings.max_observations,
                       explain_full=explain != "basic")
        metrics.preprocess_seconds.labels(task).observe(time.perf_counter() - t0)
        _count(metrics, task, prep)
        if prep.problems:
            raise ApiError(422, "invalid_stay", _prefixed(prep.problems[0], ["body"]))
        preds = await _infer(handle, prep, settings, metrics, task, monitoring, choice, explain)
        return _json(preds[0])

    predict.__doc__ = f"Score one ICU stay with the {task} model."
    return predict


for _task in ("mortality", "phenotypes"):
    router.add_api_route(
        f"/predict/{_task}", _single(_task), methods=["POST"], response_model=Prediction,
        responses={**ERRORS, **(response_examples() if _task == "mortality" else {})},
        name=f"predict_{_task}", summary=f"Score one stay ({_task})",
        operation_id=f"predict_{_task}")


@router.post("/predict/{task}/batch", response_model=BatchResponse,
             responses={**ERRORS, **response_examples(batch=True)},
             summary="Score many stays; each succeeds or fails on its own")
async def predict_batch(
    task: str,
    body: Annotated[BatchRequest, Body(openapi_examples=batch_examples("mortality"))],
    request: Request, registry: RegistryDep, settings: SettingsDep, metrics: MetricsDep,
    monitoring: MonitoringDep, _: ApiKey, explain: ExplainBatch = "basic",
    operating_point: PointName = None, threshold: Threshold = None, strict: Strict = False,
) -> Response:
    """Score up to SCEHR_MAX_BATCH_STAYS stays; 422 only for a malformed envelope or query."""
    handle = handle_for(registry, settings, task)
    request.state.model = task
    choice = choose_point(handle.model.spec, operating_point, threshold)
    if len(body.stays) > settings.max_batch_stays:
        metrics.validation_errors.labels(task, "too_many_stays").inc()
        raise ApiError(422, "validation_error", [Problem(
            loc=["body", "stays"], rule="too_many_stays",
            message=f"{len(body.stays)} stays; the limit is {settings.max_batch_stays}",
            allowed=f"1 to {settings.max_batch_stays} stays")])
    t0 = time.perf_counter()
    parsed = parse_stays(body.stays)
    valid = [i for i, s in enumerate(parsed) if isinstance(s, StayPayload)]
    prep = prepare(handle.model.spec, [parsed[i] for i in valid], strict=strict,
                   max_observations=settings.max_observations, explain_full=explain != "basic")
    metrics.preprocess_seconds.labels(task).observe(time.perf_counter() - t0)
    _count(metrics, task, prep, [s for s in parsed if not isinstance(s, StayPayload)])
    preds = await _infer(handle, prep, settings, metrics, task, monitoring, choice, explain)
    items: list[BatchItem] = []
    pos = {orig: k for k, orig in enumerate(valid)}
    for i, s in enumerate(parsed):
        raw_id = body.stays[i].get("id") if isinstance(body.stays[i], dict) else None
        sid = raw_id if isinstance(raw_id, str) and len(raw_id) <= 128 else None
        if not isinstance(s, StayPayload):
            items.append(BatchItem(index=i, id=sid, errors=s))
        elif pos[i] in preds:
            items.append(BatchItem(index=i, id=sid, prediction=preds[pos[i]]))
        else:
            items.append(BatchItem(index=i, id=sid, errors=_prefixed(
                prep.problems[pos[i]], ["body", "stays", i])))
    return _json(BatchResponse(response_version=RESPONSE_VERSION, model=handle.model.spec.ref,
                               items=items))
