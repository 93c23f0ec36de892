"""An interface is a codec: `decode` turns a request's body into stays (or tensors), `encode`
turns the scorer's per-stay results into the interface's answer.

Everything else a scoring route does is the same for every interface and lives in the
endpoint factory (`scehr.service.interfaces.endpoint`): the model handle, the options, the body
(read once), the arrival time the deadline starts from, where the work runs (one offload
rule), the scorer call and the freeing of large lists. The scorer (`scehr.service.scorer`) owns the
model run, its deadline, monitoring and the audit line. So a new interface is one codec (a
subclass of `Codec` in `service/interfaces/<name>.py`) and one line that registers it on a
router (`endpoint.add_scoring_route`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fastapi import Request
from fastapi.responses import Response

from scehr.schemas.ingest import Stay
from scehr.schemas.payloads import ErrorBody, Prediction, Problem
from scehr.schemas.trajectory_payloads import TrajectoryPrediction
from scehr.service.batcher import ModelInputs
from scehr.service.deps import handle_for
from scehr.service.errors import ApiError
from scehr.service.interfaces.options import OPTIONS
from scehr.service.metrics import Metrics
from scehr.service.model import ModelSpec
from scehr.service.registry import ModelHandle, Registry
from scehr.service.scorer import ScoredStays, ScoreOptions, StayResult
from scehr.service.settings import Settings

Loc = list[str | int]

#: The error answers every scoring route may give (an interface adds its own).
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


@dataclass(slots=True)
class Call:
    """One scoring request, as the endpoint factory hands it to its codec: the body's bytes,
    the model, the scorer's options and the route's parameters (`values`: path parameters,
    the codec's own query parameters and every option of `OPTIONS`)."""

    request: Request
    task: str
    handle: ModelHandle
    raw: bytes
    options: ScoreOptions
    values: dict[str, Any]
    settings: Settings

    @property
    def spec(self) -> ModelSpec:
        return self.handle.model.spec

    @property
    def metrics(self) -> Metrics:
        return self.request.app.state.metrics


@dataclass(slots=True)
class Decoded:
    """What a codec read from a request: the stays to score (or the graph's own `tensors`),
    the problems of stays it could not even read (`refused`, counted in the metrics), whether
    there is anything to score at all, the large lists to free one element at a time once
    answered (`scehr.service.offload.release`), and whatever `encode` needs of the request."""

    stays: list[Stay] = field(default_factory=list)
    refused: list[list[Problem]] = field(default_factory=list)
    tensors: ModelInputs | None = None
    score: bool = True
    heaps: tuple[list[Any], ...] = ()
    context: Any = None

    @property
    def rows(self) -> int:
        """Stays (or tensor rows) the request carries, read or not."""
        if self.tensors is not None:
            return self.tensors.rows
        return len(self.stays) + len(self.refused)


def body_loc(loc: Loc) -> Loc:
    """A payload field path as the JSON single-stay route's body path."""
    return ["body", *loc]


def _answered(scored: ScoredStays | None, locate: Callable[[Loc], Loc], answer: str
              ) -> StayResult:
    """The result of a request of one stay answered as a whole, when it has its `answer`
    (a `StayResult` field), or `ApiError` 422 with the stay's problems, each field path
    mapped by `locate` to the interface's (e.g. a FHIR path)."""
    assert scored is not None
    res = scored.results[0]
    if getattr(res, answer) is None:
        raise ApiError(422, "invalid_stay", [p.model_copy(update={"loc": locate(p.loc)})
                                             for p in res.problems])
    return res


def one_prediction(scored: ScoredStays | None, locate: Callable[[Loc], Loc] = body_loc
                   ) -> tuple[Prediction, StayResult]:
    """The prediction of a request of one stay answered as a whole (and its result), or
    `ApiError` 422 with the stay's problems (`_answered`)."""
    res = _answered(scored, locate, "prediction")
    assert res.prediction is not None
    return res.prediction, res


def one_trajectory(scored: ScoredStays | None, locate: Callable[[Loc], Loc] = body_loc
                   ) -> tuple[TrajectoryPrediction, StayResult]:
    """`one_prediction` of a request for the stay's risk at every hour: its trajectory."""
    res = _answered(scored, locate, "trajectory")
    assert res.trajectory is not None
    return res.trajectory, res


class Codec(ABC):
    """One interface: its route (`path`, `name`, `route`: the rest of FastAPI's
    `add_api_route` arguments, for OpenAPI), the query options it takes (`options`, names of
    `OPTIONS`; `defaults` where its own differ; `params`: its own query parameters), and how
    its bodies become stays (`decode`) and results its answer (`encode`).

    `whole`: a request is answered as a whole (a refused stay refuses it; nothing is run).
    `byte_cost`: the CPU to decode one byte of its body, relative to a JSON stay's, for the
    offload rule (`scehr.service.offload.heavy`). `versions`: it answers in the response version
    the request asks for (`RESPONSE_VERSION_HEADER`)."""

    path: str
    name: str
    route: Mapping[str, Any] = {}
    options: tuple[str, ...] = tuple(OPTIONS)
    defaults: ClassVar[Mapping[str, Any]] = {}
    params: ClassVar[Mapping[str, tuple[Any, Any]]] = {}
    whole: ClassVar[bool] = True
    byte_cost: ClassVar[float] = 1.0
    versions: ClassVar[bool] = False

    def task(self, path: Mapping[str, Any]) -> str | None:
        """The task a request is for, from its path parameters (None: the path names none of
        this interface's, answered by `not_found`). Also read by the load-shedding
        middleware, before the body, to count the request for its task."""
        task = path.get("task")
        return task if isinstance(task, str) else None

    def per_hour(self, task: str) -> bool:
        """Whether a request for `task` is answered with the risk at every hour (a landmark
        model's trajectory, `StayResult.trajectory`) rather than one `Prediction`."""
        return False

    def not_found(self, path: Mapping[str, Any]) -> ApiError:
        """The answer to a path that names no task."""
        return ApiError(404, "model_not_found", message="no model is served here for this "
                        "task")

    def handle(self, registry: Registry, settings: Settings, task: str,
               version: str | None) -> ModelHandle:
        """The model that answers (404 when not served, 503 while it loads)."""
        return handle_for(registry, settings, task, version)

    @abstractmethod
    def decode(self, call: Call) -> Decoded:
        """The request's stays (runs in a worker thread when the request is heavy)."""

    @abstractmethod
    def encode(self, call: Call, decoded: Decoded, scored: ScoredStays | None) -> Any:
        """The answer: a `Response`, or what the route's `response_model` serializes
        (runs in a worker thread when the request is heavy). `scored` is None when `decoded`
        had nothing to score."""

    def refusal(self, error: Exception) -> Response | None:
        """The interface's own answer to an error (None: the service's `ErrorBody`)."""
        return None
