"""Scoring: one stay per task, or a batch where every stay succeeds or fails on its own."""

import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.responses import Response

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
from service.deps import MetricsDep, RegistryDep, SettingsDep, handle_for
from service.errors import ApiError
from service.examples import batch_examples, stay_examples
from service.metrics import Metrics
from service.pipeline import Prepared, parse_stays, predictions, prepare
from service.registry import ModelHandle
from service.settings import Settings

router = APIRouter(tags=["predict"])

Explain = Annotated[Literal["basic", "full"], Query(
    description="basic: anchors and nearest prototype; full: also per-variable contributions "
    "by occlusion (one batched ONNX run)")]
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
    return Response(model.model_dump_json(), media_type="application/json")


def _count(metrics: Metrics, task: str, prep: Prepared,
           extra: list[list[Problem]] | None = None) -> None:
    for problems in [*prep.problems.values(), *(extra or [])]:
        for p in problems:
            metrics.validation_errors.labels(task, p.rule).inc()
    for notes in prep.notices:
        for n in notes:
            metrics.warnings.labels(task, n.code).inc()


async def _infer(handle: ModelHandle, prep: Prepared, settings: Settings,
                 metrics: Metrics, task: str) -> dict[int, Prediction]:
    if prep.inputs is None:
        return {}
    try:
        out = await handle.batcher.submit(prep.inputs)
    except Overloaded:
        metrics.overload.labels(task).inc()
        raise ApiError(503, "overloaded", headers={"Retry-After": str(settings.retry_after_s)},
                       message="too many requests queued for this model; retry later") from None
    return predictions(handle.model.spec, prep, out)


def _prefixed(problems: list[Problem], prefix: list[str | int]) -> list[Problem]:
    return [p.model_copy(update={"loc": [*prefix, *p.loc]}) for p in problems]


def _body_loc(loc: list[str | int]) -> list[str | int]:
    return ["body", *loc]


async def score_one(handle: ModelHandle, stay: StayPayload, settings: Settings,
                    metrics: Metrics, task: str, *, explain: str = "basic",
                    strict: bool = False,
                    locate: Callable[[list[str | int]], list[str | int]] = _body_loc,
                    ) -> Prediction:
    """The one-stay path every interface runs (JSON, FHIR, CDS Hooks, Open Inference).

    `locate` maps a payload field path to the caller's (e.g. a FHIR path) in 422 problems.
    """
    t0 = time.perf_counter()
    prep = prepare(handle.model.spec, [stay], strict=strict,
                   max_observations=settings.max_observations,
                   explain_full=explain == "full")
    metrics.preprocess_seconds.labels(task).observe(time.perf_counter() - t0)
    _count(metrics, task, prep)
    if prep.problems:
        raise ApiError(422, "invalid_stay", [p.model_copy(update={"loc": locate(p.loc)})
                                             for p in prep.problems[0]])
    return (await _infer(handle, prep, settings, metrics, task))[0]


def _single(task: str) -> Callable[..., Awaitable[Response]]:
    async def label(request: Request) -> None:  # runs even when the body fails validation
        request.state.model = task

    async def predict(
        stay: Annotated[StayPayload, Body(openapi_examples=stay_examples(task))],
        request: Request, registry: RegistryDep, settings: SettingsDep, metrics: MetricsDep,
        _: ApiKey, __: Annotated[None, Depends(label)], explain: Explain = "basic",
        strict: Strict = False,
    ) -> Response:
        handle = handle_for(registry, settings, task)
        return _json(await score_one(handle, stay, settings, metrics, task, explain=explain,
                                     strict=strict))

    predict.__doc__ = f"Score one ICU stay with the {task} model."
    return predict


for _task in ("mortality", "phenotypes"):
    router.add_api_route(
        f"/predict/{_task}", _single(_task), methods=["POST"], response_model=Prediction,
        responses=ERRORS, name=f"predict_{_task}", summary=f"Score one stay ({_task})",
        operation_id=f"predict_{_task}")


@router.post("/predict/{task}/batch", response_model=BatchResponse, responses=ERRORS,
             summary="Score many stays; each succeeds or fails on its own")
async def predict_batch(
    task: str,
    body: Annotated[BatchRequest, Body(openapi_examples=batch_examples("mortality"))],
    request: Request, registry: RegistryDep, settings: SettingsDep, metrics: MetricsDep,
    _: ApiKey, explain: Explain = "basic", strict: Strict = False,
) -> Response:
    """Score up to SCEHR_MAX_BATCH_STAYS stays; 422 only for a malformed envelope."""
    handle = handle_for(registry, settings, task)
    request.state.model = task
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
                   max_observations=settings.max_observations, explain_full=explain == "full")
    metrics.preprocess_seconds.labels(task).observe(time.perf_counter() - t0)
    _count(metrics, task, prep, [s for s in parsed if not isinstance(s, StayPayload)])
    preds = await _infer(handle, prep, settings, metrics, task)
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
    return _json(BatchResponse(model=handle.model.spec.ref, items=items))
