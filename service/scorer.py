"""The one scoring path behind every interface: prepare -> batcher with a deadline -> read-outs
-> monitoring -> audit line.

Every interface is a codec (`scehr.service.interfaces`): it decodes its input into stays, the
endpoint factory calls `Scorer.score` (or `Scorer.score_tensors`), and the codec encodes the
per-stay `StayResult`s; `scehr score` calls `score_offline`. Load shedding happens before the
body is read (`scehr.service.load_shedding`), for every interface's scoring route alike, so it is
not repeated here. Whatever an interface, the same stay gets the same risk, warnings, audit
line, monitoring counts, deadline and overload answers.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Protocol

import numpy as np

from scehr.schemas.contract import RESPONSE_VERSION
from scehr.schemas.ingest import Stay
from scehr.schemas.payloads import Prediction, Problem, StayPayload
from scehr.schemas.trajectory_payloads import TrajectoryPrediction
from scehr.service.batcher import (
    DeadlineExceeded,
    ModelInputs,
    ModelOutputs,
    Overloaded,
    run_chunked,
)
from scehr.service.batcher import concat_outputs as batched_outputs
from scehr.service.errors import ApiError
from scehr.service.explain import DEFAULT_EXPLAIN, LEVELS, Explain
from scehr.service.metrics import Metrics
from scehr.service.model import ModelSpec, ReadOuts, read_out
from scehr.service.monitoring import Monitoring
from scehr.service.offload import in_worker
from scehr.service.operating import Choice
from scehr.service.pipeline import PreparedStays, prepare, tensor_rows
from scehr.service.responses import predictions
from scehr.service.settings import Settings
from scehr.service.trajectory import trajectories
from scehr.service.unread_variables import compact

if TYPE_CHECKING:  # the registry imports ONNX Runtime: `scehr score` loads it when it runs
    from scehr.service.registry import LoadedModel, ModelHandle

log = logging.getLogger("scehr.scorer")
audit_log = logging.getLogger("scehr.audit")
#: What the scorer answers a prepared stay: its prediction, or its trajectory when asked.
Answer = Prediction | TrajectoryPrediction


class InFlight(Protocol):
    """Requests admitted per task in this worker: the load shedder's count
    (`scehr.service.load_shedding.LoadShedder`), read by the scorer, never changed."""

    def alone(self, task: str) -> bool: ...


class _NoneAdmitted:
    """Without a load shedder (no server): never alone, so the batcher always queues."""

    def alone(self, task: str) -> bool:
        return False


@dataclass(frozen=True)
class ScoreOptions:
    """How to score: explanation depth, strict cleaning, the operating point (None: the
    model's default), `all_or_none` (stop before the model when any stay is refused, for
    interfaces that answer a request as a whole) and the response version of the answers."""

    explain: Explain = DEFAULT_EXPLAIN
    strict: bool = False
    choice: Choice | None = None
    all_or_none: bool = False
    response_version: str = RESPONSE_VERSION
    #: answer each stay's risk at every hour (a landmark model's `TrajectoryPrediction`)
    trajectory: bool = False


@dataclass
class StayResult:
    """One input stay's outcome: its prediction, or the problems that refused it (field paths
    relative to the stay's payload; the codec maps them to its own, e.g. a FHIR path).
    Another outcome (e.g. an abstention with its reason) belongs here, beside these two, so
    that every codec encodes it from one place."""

    index: int
    id: str | None = None
    prediction: Prediction | None = None
    problems: list[Problem] = field(default_factory=list)
    #: the stay's risk at every hour, when the request asked for its trajectory
    trajectory: TrajectoryPrediction | None = None
    #: () -> (`rows_read`'s rows, each one's time in hours): the rows read up to an hour
    rows_at: Callable[[], tuple[tuple[int, ...], tuple[float, ...]]] | None = None
    #: () -> the payload's observation rows (reading order) whose values reached the model,
    #: computed on demand: for codecs that point back to their sources (FHIR `basis`)
    rows_read: Callable[[], tuple[int, ...]] | None = None

    @property
    def scored(self) -> bool:
        return self.prediction is not None or self.trajectory is not None

    def contributed_rows(self) -> tuple[int, ...] | None:
        """The rows the model read (None: not known, e.g. a stay that was not prepared)."""
        return None if self.rows_read is None else self.rows_read()


@dataclass
class ScoredStays:
    """Per input stay its result, in input order; `outputs` are the model's rows for the
    stays that passed, in the same order (Open Inference returns them as tensors)."""

    results: list[StayResult]
    outputs: ModelOutputs | None = None


def _audit(spec: ModelSpec, preds: Sequence[Answer]) -> None:
    """One structured log line per prediction: identifiers and hashes, never values."""
    for p in preds:
        a = p.audit
        audit_log.info("prediction", extra={
            "task": spec.task, "model_version": a.model_version,
            "model_sha256": a.model_sha256, "feature_set_hash": a.feature_set_hash,
            "operating_point": a.operating_point, "input_sha256": a.input_sha256,
            "status": p.status, "alerts": len(p.alerts) if isinstance(p, TrajectoryPrediction)
            else sum(r.alert for r in p.results)})


#: Stays prepared, run and read out together: a larger request goes through in chunks of this
#: many, so that no single numpy call of its preparation or read-out (a tensor of every stay's
#: occlusion variants, which grows with stays x channels) holds the GIL, and the event loop
#: with it, for long; each chunk's deadline counts the model runs of the chunks before it.
CHUNK_STAYS = 16


def concat_outputs(parts: list[ModelOutputs]) -> ModelOutputs | None:
    """The model's rows of consecutive chunks, in order."""
    if len(parts) <= 1:
        return parts[0] if parts else None
    return batched_outputs(parts)


def _results(prep: PreparedStays, preds: dict[int, Answer]) -> list[StayResult]:
    rows = dict(zip(prep.ok, prep.rows, strict=False)) if preds else {}
    timed = dict(zip(prep.ok, prep.rows_at, strict=False)) if preds else {}
    out = []
    for i in range(prep.n):
        a = preds.get(i)
        out.append(StayResult(i, prep.ids[i], prediction=a if isinstance(a, Prediction) else None,
                              problems=prep.problems.get(i, []), rows_read=rows.get(i),
                              trajectory=a if isinstance(a, TrajectoryPrediction) else None,
                              rows_at=timed.get(i)))
    return out


def prepared(spec: ModelSpec, stays: list[Stay], options: ScoreOptions,
             max_observations: int, served: Callable[[], Sequence[ModelSpec]] = tuple
             ) -> PreparedStays:
    """`pipeline.prepare` with the options' cleaning and explanation, then each refused
    stay's unread variables compacted, with the `served` version that reads them
    (`scehr.service.unread_variables`)."""
    prep = prepare(spec, stays, strict=options.strict, max_observations=max_observations,
                   occlusion=LEVELS[options.explain].occlusion,
                   screened=LEVELS[options.explain].screened)
    if prep.problems:
        others = served()
        for i, problems in prep.problems.items():
            prep.problems[i] = compact(spec, stays[i], problems, others)
    return prep


def answers(spec: ModelSpec, prep: PreparedStays, out: ModelOutputs, options: ScoreOptions,
            readouts: ReadOuts | None = None) -> dict[int, Answer]:
    """The predictions (or trajectories) of the prepared stays, as the options ask for them."""
    if options.trajectory:
        return dict(trajectories(spec, prep, out, options.response_version))
    return predictions(spec, prep, out, choice=options.choice, explain=options.explain,
                       readouts=readouts, response_version=options.response_version)


def score_offline(model: LoadedModel, stays: list[StayPayload], *, strict: bool = False,
                  max_observations: int, max_rows: int | None = None,
                  allow_insufficient: bool = False, trajectory: bool = False
                  ) -> list[StayResult]:
    """The scorer's path without a server (`scehr score`): the same preparation and answers,
    the model run in chunks on this thread; no load shedding, deadline, monitoring or audit log
    (the output file holds each prediction's audit record). `allow_insufficient` scores a
    stay below the model's data minimum anyway, as the API's `allow_insufficient=true`;
    `trajectory` answers each stay's risk at every hour (a landmark model)."""
    spec = model.spec
    choice = (replace(spec.points.default_choice(), allow_insufficient=True)
              if allow_insufficient else None)
    options = ScoreOptions(strict=strict, choice=choice, trajectory=trajectory)
    prep = prepared(spec, stays, options, max_observations)
    preds: dict[int, Answer] = {}
    if prep.inputs is not None:
        out = run_chunked(model.run, prep.inputs, max_rows or model.max_batch_size)
        preds = answers(spec, prep, out, options)
    return _results(prep, preds)


class Scorer:
    """Scores stays on a served model: the app holds one (`app.state.scorer`)."""

    def __init__(self, settings: Settings, metrics: Metrics, monitoring: Monitoring,
                 served: Callable[[str], Sequence[ModelSpec]] = lambda task: (),
                 in_flight: InFlight | None = None) -> None:
        """`served(task)`: the task's loaded models, for the hint naming a version that reads
        what the chosen one does not; `in_flight`: the requests admitted per task (the load
        shedder), which says when a light request is alone (none: never)."""
        self.settings = settings
        self.metrics = metrics
        self.monitoring = monitoring
        self.served = served
        self.in_flight = in_flight or _NoneAdmitted()

    async def score(self, handle: ModelHandle, stays: list[Stay],
                    options: ScoreOptions = ScoreOptions(), *, heavy: bool = True,
                    refused: Sequence[list[Problem]] = (),
                    since: float | None = None) -> ScoredStays:
        """Score `stays` on `handle`'s model: one `StayResult` per stay, in order.

        `heavy` runs preparation, the ONNX run and read-outs off the event loop
        (`scehr.service.offload.heavy`); a light request alone for its model (`in_flight`) on an
        idle batcher runs the ONNX run on the calling thread (`MicroBatcher.submit`).
        `refused` are the problems of stays the codec could not even decode (counted in the
        validation metrics with the others); `since` (`time.perf_counter()`) is when the
        request's body had arrived, where its deadline starts (default: now). Raises
        `ApiError` 503/504 (overload, deadline) and 500 (the model failed)."""
        since = time.perf_counter() if since is None else since
        if len(stays) <= CHUNK_STAYS:
            alone = None if heavy else self._alone(handle.model.task)
            return (await self._score_chunk(handle, stays, options, heavy, alone, refused,
                                            since, 0))[0]
        results: list[StayResult] = []
        outputs: list[ModelOutputs] = []
        rows = 0  # model rows of the chunks before: the deadline grows with them
        for start in range(0, len(stays), CHUNK_STAYS):
            part, rows = await self._score_chunk(
                handle, stays[start:start + CHUNK_STAYS], options, heavy, None,
                refused if start == 0 else (), since, rows)
            results += [replace(r, index=r.index + start) for r in part.results]
            if part.outputs is not None:
                outputs.append(part.outputs)
        return ScoredStays(results, concat_outputs(outputs))

    async def _score_chunk(self, handle: ModelHandle, stays: list[Stay],
                           options: ScoreOptions, heavy: bool,
                           alone: Callable[[], bool] | None, refused: Sequence[list[Problem]],
                           since: float, rows_before: int) -> tuple[ScoredStays, int]:
        """`score` of up to CHUNK_STAYS stays; also the model rows so far (`rows_before` +
        this chunk's)."""
        spec = handle.model.spec
        task = spec.task
        t0 = time.perf_counter()
        prep = await in_worker(heavy, self._prepare, spec, stays, options)
        self.metrics.child(self.metrics.preprocess_seconds, task).observe(
            time.perf_counter() - t0)
        self._count(task, prep, refused)
        if prep.inputs is None or (options.all_or_none and prep.problems):
            return ScoredStays(_results(prep, {})), rows_before
        rows = rows_before + prep.inputs.rows
        # a heavy request keeps its ORT run off the event loop too, even alone
        out = await self._run(handle, prep.inputs, None if heavy else alone, since, rows)
        return await in_worker(heavy, self._finish, spec, prep, out, options,
                               handle.default), rows

    def _alone(self, task: str) -> Callable[[], bool]:
        """Whether, when asked, the request is the only one admitted for `task`."""
        in_flight = self.in_flight
        return lambda: in_flight.alone(task)

    def _prepare(self, spec: ModelSpec, stays: list[Stay],
                 options: ScoreOptions) -> PreparedStays:
        """`prepared`, naming the versions this server loads."""
        return prepared(spec, stays, options, self.settings.max_observations,
                        partial(self.served, spec.task))

    async def score_tensors(self, handle: ModelHandle, inputs: ModelInputs,
                            options: ScoreOptions = ScoreOptions(), *, heavy: bool = True,
                            since: float | None = None) -> ScoredStays:
        """Score the graph's own (already normalized) tensors: the same batcher, read-outs,
        monitoring (observed variables from the masks; values cannot be binned once
        normalized) and audit line as stays; `heavy` and `since` as `score`'s."""
        spec = handle.model.spec
        since = time.perf_counter() if since is None else since
        prep = await in_worker(heavy, tensor_rows, spec, inputs)
        alone = None if heavy else self._alone(handle.model.task)
        out = await self._run(handle, inputs, alone, since, inputs.rows)
        return await in_worker(heavy, self._finish, spec, prep, out, options, handle.default)

    async def _run(self, handle: ModelHandle, inputs: ModelInputs,
                   alone: Callable[[], bool] | None, since: float, rows: int) -> ModelOutputs:
        """The model's outputs through its batcher, within the deadline of the request's
        `rows` so far (this run's and its earlier chunks')."""
        s, task = self.settings, handle.model.task
        retry = {"Retry-After": str(s.retry_after_s)}
        # The deadline covers decoding and preparation (from `since`), the queue wait and the
        # compute: SCEHR_REQUEST_TIMEOUT_S per ORT run the request needs (one for a stay, more
        # for a big batch or explain's variants). Past it already: never queued nor computed.
        runs = -(-rows // handle.model.max_batch_size)
        deadline = since + s.request_timeout_s * runs
        if time.perf_counter() >= deadline:
            self.metrics.overload.labels(task).inc()
            raise ApiError(503, "deadline_exceeded", headers=retry, message="the request "
                           f"took {s.request_timeout_s} s before reaching the model; retry "
                           "later")
        try:
            return await handle.batcher.submit(inputs, deadline, alone)
        except Overloaded:
            self.metrics.overload.labels(task).inc()
            raise ApiError(503, "overloaded", headers=retry, message="too many requests "
                           "queued for this model; retry later") from None
        except DeadlineExceeded as e:
            if e.computing:
                raise ApiError(504, "deadline_exceeded", message="the model did not answer "
                               f"within {s.request_timeout_s} s") from None
            self.metrics.overload.labels(task).inc()
            raise ApiError(503, "deadline_exceeded", headers=retry, message="the request "
                           f"waited {s.request_timeout_s} s for the model; retry later") from None
        except Exception:
            log.exception("inference failed", extra={"model": task})
            raise ApiError(500, "inference_failed", message="the model failed on this "
                           "request's batch; the request id is in the server's logs") from None

    def _finish(self, spec: ModelSpec, prep: PreparedStays, out: ModelOutputs,
                options: ScoreOptions, default: bool) -> ScoredStays:
        """Read-outs, then monitoring and the audit line of every scored stay (`default`:
        the task's default version, whose monitor feeds the gauges)."""
        ro = read_out(spec, out)
        preds = answers(spec, prep, out, options, ro)
        n = len(prep.ok)
        # a stay below the data minimum got no risk: counted, and left out of the served
        # population that drift monitoring compares with validation
        kept = np.array([preds[i].status == "scored" for i in prep.ok], dtype=bool)
        self.monitoring.for_spec(spec, gauges=default).answered(~kept)
        if not kept.all():
            self.metrics.warnings.labels(spec.task, "insufficient_data").inc(
                int((~kept).sum()))
        if prep.observed is not None and kept.any():
            risk, prob = ro.risk[:n][kept], ro.probability[:n][kept]
            self.monitoring.for_spec(spec, gauges=default).observe(
                prep.observed[kept], None if prep.values is None else prep.values[kept], risk,
                spec.points.alerts_of_every_point(risk, prob))
        _audit(spec, [preds[i] for i in prep.ok])
        return ScoredStays(_results(prep, preds), out.take(0, n))

    def _count(self, task: str, prep: PreparedStays, refused: Sequence[list[Problem]]) -> None:
        """Problems by rule and notices by code: one increment per label set (a stay
        typically has several `channel_not_observed` notices; each `labels()` takes a lock)."""
        rules = Counter(p.rule for ps in [*prep.problems.values(), *refused] for p in ps)
        for rule, k in rules.items():
            self.metrics.child(self.metrics.validation_errors, task, rule).inc(k)
        for code, k in Counter(n.code for notes in prep.notices for n in notes).items():
            self.metrics.child(self.metrics.warnings, task, code).inc(k)

