"""Admission control: a model's full pipeline refuses new requests before reading their body.

A predict request is admitted per model (`SCEHR_MAX_QUEUE_SIZE` at a time, counting those being
parsed, queued or computed) and given a deadline (`SCEHR_REQUEST_TIMEOUT_S`) that the batcher
enforces. Refused requests cost a path match and a small 503: under overload the server keeps
spending its time on requests it can finish, so goodput stays near the throughput limit.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Receive, Scope, Send

from schemas.contract import TASKS
from schemas.payloads import ErrorBody, Problem
from service.logs import request_id_var
from service.metrics import Metrics
from service.middleware import send_error

_PREDICT = re.compile(r"^/predict/([^/]+)(?:/batch)?/?$")


@dataclass
class Admission:
    """Requests admitted per model; never above `limit`."""

    limit: int
    admitted: dict[str, int] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)

    def try_admit(self, task: str) -> bool:
        n = self.admitted.get(task, 0)
        if n >= self.limit:
            return False
        self.admitted[task] = n + 1
        self.peak[task] = max(self.peak.get(task, 0), n + 1)
        return True

    def release(self, task: str) -> None:
        self.admitted[task] = max(0, self.admitted.get(task, 0) - 1)


def predict_task(scope: Scope) -> str | None:
    """The task of a predict route (only from the closed set of tasks), else None."""
    if scope.get("method") != "POST":
        return None
    m = _PREDICT.match(scope.get("path", ""))
    return m.group(1) if m and m.group(1) in TASKS else None


class AdmissionMiddleware:
    """503 + Retry-After without reading the body when the model is full; else a deadline."""

    def __init__(self, app: ASGIApp, admission: Admission, metrics: Metrics,
                 timeout_s: float, retry_after_s: int) -> None:
        self.app = app
        self.admission = admission
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.retry_after = str(retry_after_s).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = predict_task(scope) if scope["type"] == "http" else None
        if task is None:
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})["model"] = task
        if not self.admission.try_admit(task):
            self.metrics.overload.labels(task).inc()
            await send_error(send, 503, ErrorBody(
                error="overloaded", request_id=request_id_var.get(), detail=[Problem(
                    loc=[], rule="overloaded",
                    message=f"{self.admission.limit} requests are already being handled for "
                    "this model; retry later")]), [(b"retry-after", self.retry_after)])
            return
        scope["state"]["deadline"] = time.perf_counter() + self.timeout_s
        try:
            await self.app(scope, receive, send)
        finally:
            self.admission.release(task)
