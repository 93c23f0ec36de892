"""The risk at every hour of a stay: `POST /predict/{task}/trajectory` (one stay, JSON),
`/predict/{task}/trajectory/batch` and `/fhir/predict/{task}/trajectory` (a Bundle ->
RiskAssessments by hour).

`{task}` is the outcome (e.g. `mortality`); the default version of the landmark task giving
that outcome at every hour (`TaskSpec.landmarks`: `mortality-landmark`) answers. The graph runs
once per stay; `scehr.service.trajectory` reads its per-hour outputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

from fastapi import Query
from fastapi.responses import Response

from scehr.schemas.contract import RESPONSE_VERSION, RESPONSE_VERSION_HEADER
from scehr.schemas.tasks import TASK_SPECS, landmark_task
from scehr.schemas.trajectory_payloads import (
    TrajectoryBatchItem,
    TrajectoryBatchResponse,
    TrajectoryPrediction,
)
from scehr.service.deps import handle_for
from scehr.service.errors import ApiError
from scehr.service.interfaces.base import ERRORS, Call, Codec, Decoded, one_trajectory
from scehr.service.interfaces.fhir import Fhir
from scehr.service.interfaces.json_batch import JsonBatch, batch_response
from scehr.service.interfaces.json_single import parse_stay
from scehr.service.interop.fhir_out import FHIR_JSON, to_json
from scehr.service.interop.fhir_trajectory import trajectory_bundle
from scehr.service.query_route import QueryRoute
from scehr.service.registry import ModelHandle, Registry
from scehr.service.scorer import ScoredStays
from scehr.service.settings import Settings

#: The options a trajectory takes: the hours are the policy's, not an operating point's.
OPTIONS = ("strict", "version")


def trajectory_handle(registry: Registry, settings: Settings, task: str,
                      version: str | None) -> ModelHandle:
    """The landmark model answering; 404 naming the task when none is served here."""
    try:
        return handle_for(registry, settings, task, version)
    except ApiError as e:
        if e.error != "model_not_found":
            raise
        raise ApiError(404, "model_not_found", message=f"no {task} model is served here: "
                       f"the risk at every hour needs one (add it to the model folder's "
                       "index.json and SCEHR_TASKS)") from None


class _PerHour:
    """What the trajectory codecs share: the landmark task of the path's outcome, its
    handle, and the per-hour answer."""

    options = OPTIONS

    def task(self, path: Mapping[str, Any]) -> str | None:
        task = path.get("task")
        return landmark_task(task) if isinstance(task, str) else None

    def not_found(self, path: Mapping[str, Any]) -> ApiError:
        outcomes = [t.name for t in TASK_SPECS.values() if not t.landmarks
                    and landmark_task(t.name) is not None]
        return ApiError(404, "model_not_found", message="no landmark task gives this task's "
                        f"risk at every hour (trajectories are served for: "
                        f"{', '.join(outcomes)})")

    def handle(self, registry: Registry, settings: Settings, task: str,
               version: str | None) -> ModelHandle:
        return trajectory_handle(registry, settings, task, version)

    def per_hour(self, task: str) -> bool:
        return True


class JsonTrajectory(_PerHour, Codec):
    """One stay (the body `POST /predict/{task}` takes) -> its `TrajectoryPrediction`: a route
    per outcome with a landmark task (no path parameter: `QueryRoute`'s fast path)."""

    def __init__(self, task: str) -> None:
        self.fixed_task = task
        self.path = f"/predict/{task}/trajectory"
        self.name = f"predict_{task}_trajectory"
        self.route = {
            "response_model": TrajectoryPrediction, "responses": ERRORS,
            "summary": f"The risk at every hour of one stay ({task})",
            "description": "Hour h = 1..min(hours of data, 48): the risk from the data up to "
            "h, its interval, scored or abstained (with why) and whether it is at the alert "
            f"threshold; then the alert events of the model's alert policy. The default "
            f"{landmark_task(task)} model answers.", "operation_id": f"predict_{task}_trajectory",
            "openapi_extra": {"requestBody": {"required": True, "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/StayPayload"}}}}},
            "route_class_override": QueryRoute}

    def task(self, path: Mapping[str, Any]) -> str | None:
        return landmark_task(self.fixed_task)

    def decode(self, call: Call) -> Decoded:
        return Decoded([parse_stay(call.raw)])

    def encode(self, call: Call, decoded: Decoded, scored: ScoredStays | None) -> Response:
        traj, _ = one_trajectory(scored)
        return Response(traj.model_dump_json(), media_type="application/json",
                        headers={RESPONSE_VERSION_HEADER: traj.response_version})


class JsonTrajectoryBatch(_PerHour, JsonBatch):
    """Many stays, each with its trajectory or its own errors."""

    path = "/predict/{task}/trajectory/batch"
    name = "predict_trajectory_batch"
    route: ClassVar[Mapping[str, Any]] = {
        **JsonBatch.route, "response_model": TrajectoryBatchResponse, "responses": ERRORS,
        "openapi_extra": {"requestBody": JsonBatch.route["openapi_extra"]["requestBody"]},
        "summary": "The risk at every hour of many stays; each succeeds or fails on its own",
        "description": "Up to SCEHR_MAX_BATCH_STAYS stays, each answered as "
        "`POST /predict/{task}/trajectory` answers one; 422 only for a malformed envelope or "
        "query."}
    versions = False

    def encode(self, call: Call, decoded: Decoded, scored: ScoredStays | None) -> Response:
        assert scored is not None
        raw, parsed = decoded.context
        return batch_response(call.spec, raw, parsed, scored, RESPONSE_VERSION,
                              TrajectoryBatchItem, answer="trajectory")


class FhirTrajectory(_PerHour, Fhir):
    """A Bundle -> a Bundle of RiskAssessments, one per scored hour."""

    path = "/fhir/predict/{task}/trajectory"
    name = "fhir_predict_trajectory"
    route: ClassVar[Mapping[str, Any]] = {
        **Fhir.route, "summary": "The risk at every hour of one stay sent as a FHIR R4 Bundle",
        "description": "One RiskAssessment per scored hour (occurrenceDateTime: the ICU "
        "admission + h hours; basis: the Observations read up to h); the abstained hours and "
        "why in the OperationOutcome.",
        "responses": {**ERRORS, 200: {"content": {FHIR_JSON: {}}, "description":
                      "A collection Bundle: a RiskAssessment per scored hour, hour 1 first, "
                      "and an OperationOutcome of the abstained hours and warnings"}}}
    params: ClassVar[Mapping[str, Any]] = {
        "admission_time": Fhir.params["admission_time"],
        "end_hours": (Annotated[float | None, Query(
            gt=0, allow_inf_nan=False, description="Hours from admission to the end of the "
            "data so far: the trajectory's last hour (default: the last Observation's)")],
            None)}

    def encode(self, call: Call, decoded: Decoded, scored: ScoredStays | None) -> Response:
        stay = decoded.context
        traj, res = one_trajectory(scored, stay.locate)
        rows, times = res.rows_at() if res.rows_at is not None else (None, None)
        admission = stay.payload.columns.admission
        return Response(to_json(trajectory_bundle(traj, stay, admission, rows, times)),
                        media_type=FHIR_JSON)
