"""Load shedding: a model's full pipeline refuses new requests before reading their body.

A scoring request of any interface (JSON, FHIR, CDS Hooks, Open Inference) is refused at once
when its model is full; otherwise its body is read under a deadline (`SCEHR_BODY_TIMEOUT_S`,
408 and the connection closed when it stalls) and only then is it admitted, while fewer than
the model's limit are in the pipeline (being parsed, queued or computed): a client that sends
headers and then stalls holds a connection, never a place in the pipeline. A request counts by
its cost, in units of `UNIT_BYTES` of body (`cost`): a 256-stay batch holds as many places as
the single stays it carries, not one. Its queue wait and
compute then have a deadline (`SCEHR_REQUEST_TIMEOUT_S`) that the batcher
enforces. The limit follows Little's law: the model's recent completion rate times an eighth of
the deadline, so an admitted request can expect to finish in time whatever the machine's speed
(at least `floor`, for a cold start; at most `SCEHR_MAX_QUEUE_SIZE`). Refused requests cost a
path match and a small 503: under overload the server spends its time on requests it can
finish, not on ones that would time out after being parsed and computed, so goodput stays near
the throughput limit.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scehr.schemas.payloads import ErrorBody, Problem
from scehr.schemas.tasks import TASK_NAMES
from scehr.service.auth import key_matches, route_needs_key
from scehr.service.logs import request_id_var
from scehr.service.media_types import body_routes, find, refusal
from scehr.service.metrics import Metrics
from scehr.service.middleware import header, send_error

#: The overload answer (an ErrorBody; request ids are ASCII by their validated shape).
_REFUSED = ErrorBody(error="overloaded", request_id="%s", detail=[Problem(
    loc=[], rule="overloaded", message="this model has as many requests as it can finish in "
    "time; retry later")]).model_dump_json().encode()


#: An admitted request should expect to wait at most this fraction (1/n) of its deadline: more
#: admitted requests would not raise throughput, only latency and the live heap.
DEADLINE_SHARE = 8
#: Seconds of completions the rate is measured over; the longest Retry-After advised.
WINDOW_S = 5.0
MAX_RETRY_AFTER_S = 60
#: Retry-After spreads refused clients so that about one refusal comes per this many completions.
REFUSALS_PER_COMPLETION_INV = 4
#: The unit of load shedding: a request costs one per started UNIT_BYTES of body, at least one. A
#: full 48-hour stay in the JSON long form is ~24 kB (one unit), a 256-stay batch of them ~190
#: units, a FHIR Bundle of 2,000 Observations ~25: parsing, validation and the rows computed
#: grow with the body, and its size is known, at no cost, before any of them starts.
UNIT_BYTES = 32 * 1024


def cost(body_bytes: int) -> int:
    """Load-shedding units of a request whose body has `body_bytes` bytes."""
    return max(1, -(-body_bytes // UNIT_BYTES))


def _prune(q: deque[float], since: float) -> None:
    while q and q[0] < since:
        q.popleft()


def _push(q: deque[float], t: float) -> None:
    q.append(t)
    if len(q) > 100_000:  # bounded whatever the rate
        q.popleft()


class _Completed:
    """Units completed in the last WINDOW_S seconds (a running sum; bounded entries)."""

    def __init__(self) -> None:
        self._q: deque[tuple[float, int]] = deque()
        self.units = 0

    def prune(self, since: float) -> None:
        while self._q and self._q[0][0] < since:
            self.units -= self._q.popleft()[1]

    def push(self, t: float, units: int) -> None:
        self._q.append((t, units))
        self.units += units
        if len(self._q) > 100_000:
            self.units -= self._q.popleft()[1]


@dataclass
class LoadShedder:
    """Units (`cost`) admitted per model; never above `limit`, nor above what can finish in
    time, except one request alone (a request larger than the limit runs by itself).

    Refused callers are told (Retry-After) to come back once the model has had time to serve
    four times as many units as requests were refused before them during the current advice
    (one unit each, as a single stay): a fair queue kept by the clients, so refusals per
    second stay near a quarter of the completions per second however many clients there are,
    and refusing costs only a small fraction of serving.
    """

    limit: int
    timeout_s: float = 5.0
    floor: int = 32
    base_retry_s: int = 1
    admitted: dict[str, int] = field(default_factory=dict)
    #: requests admitted per model (`admitted` counts their units)
    requests: dict[str, int] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)
    _done: dict[str, _Completed] = field(default_factory=dict)
    _refused: dict[str, deque[float]] = field(default_factory=dict)
    _retry: dict[str, int] = field(default_factory=dict)

    def rate(self, task: str, now: float) -> float:
        """Units of this model completed per second, recently."""
        done = self._done.get(task)
        if done is None:
            return 0.0
        done.prune(now - WINDOW_S)
        return done.units / WINDOW_S

    def capacity(self, task: str, now: float | None = None) -> int:
        """Little's law: completions per second x 1/DEADLINE_SHARE of the deadline, within
        bounds."""
        now = time.monotonic() if now is None else now
        low = min(self.limit, self.floor)
        return max(low, min(self.limit, int(self.rate(task, now) * self.timeout_s
                                            / DEADLINE_SHARE)))

    def full(self, task: str) -> bool:
        """Whether a request of `task` would be refused now."""
        return self.admitted.get(task, 0) >= self.capacity(task)

    def try_admit(self, task: str, units: int = 1) -> bool:
        """Admit a request of `units` if they fit (always when nothing is admitted)."""
        n = self.admitted.get(task, 0)
        if n and n + units > self.capacity(task):
            return False
        self.admitted[task] = n + units
        self.requests[task] = self.requests.get(task, 0) + 1
        self.peak[task] = max(self.peak.get(task, 0), n + units)
        return True

    def refuse(self, task: str) -> int:
        """Record a refusal; the Retry-After (seconds) to send with it."""
        now = time.monotonic()
        refused = self._refused.setdefault(task, deque())
        current = self._retry.get(task, self.base_retry_s)
        _prune(refused, now - max(current, self.base_retry_s, 1))
        _push(refused, now)
        rate = max(self.rate(task, now), 1.0)
        advice = min(MAX_RETRY_AFTER_S, max(self.base_retry_s,
                                            math.ceil(REFUSALS_PER_COMPLETION_INV
                                                      * (len(refused) - 1) / rate)))
        self._retry[task] = advice
        return advice

    def alone(self, task: str) -> bool:
        """Whether one request at most of `task` is admitted in this worker: nothing would
        share its ONNX run (the batcher may run it at once, on the calling thread). Counted in
        requests, not units: a lone stay of more than one unit of body is alone too."""
        return self.requests.get(task, 0) <= 1

    def release(self, task: str, completed: bool, units: int = 1) -> None:
        """`completed`: answered within its deadline (not a 5xx), which counts in the rate."""
        self.admitted[task] = max(0, self.admitted.get(task, 0) - units)
        self.requests[task] = max(0, self.requests.get(task, 0) - 1)
        if completed:
            self._done.setdefault(task, _Completed()).push(time.monotonic(), units)


class _Scoring(Protocol):
    """What the middleware reads of an interface's codec (`scehr.service.interfaces.base.Codec`):
    the task a request is for, from its path parameters."""

    def task(self, path: Mapping[str, Any]) -> str | None: ...


#: A scoring route: what matches its path, and its codec.
ScoringRoute = tuple[re.Pattern[str], _Scoring]


def scoring_routes(routes: Sequence[BaseRoute]) -> tuple[ScoringRoute, ...]:
    """The scoring routes of every interface: those the endpoint factory registered
    (`scehr.service.interfaces.endpoint.add_scoring_route`), whose endpoint carries its codec."""
    return tuple((r.path_regex, codec) for r in routes if isinstance(r, Route)
                 and (codec := getattr(r.endpoint, "codec", None)) is not None)


def scoring_task(scope: Scope, scoring: Sequence[ScoringRoute]) -> str | None:
    """The task a scoring request of any interface is for (only from the closed set of
    tasks), else None."""
    if scope.get("method") != "POST":
        return None
    path = scope.get("path", "")
    for pattern, codec in scoring:
        m = pattern.match(path)
        if m is not None:
            task = codec.task(m.groupdict())
            return task if task in TASK_NAMES else None
    return None


def keyed_paths(routes: Sequence[BaseRoute]) -> tuple[re.Pattern[str], ...]:
    """The path patterns of the routes that declare they need the API key
    (`scehr.service.auth.route_needs_key`): scoring in every interface and admin; discovery,
    metadata and probes stay open like `/models` (closable by settings)."""
    return tuple(r.path_regex for r in routes
                 if isinstance(r, Route) and route_needs_key(r))


class RetryAdvice:
    """The Retry-After each connection was last given, so that a client coming back sooner on
    the same connection is refused only once that time has come: a client that ignores
    Retry-After gets one refusal per Retry-After per connection, the wait costing the server
    a sleeping coroutine, not a CPU-bound loop of refusals that starves admitted requests.
    Keyed by the connection's (address, port), never the address alone (clients behind one
    proxy share it); at most `size` connections remembered."""

    def __init__(self, size: int = 10_000, max_hold_s: float = MAX_RETRY_AFTER_S) -> None:
        self.size = size
        self.max_hold_s = max_hold_s
        self._due: dict[Any, float] = {}

    async def hold(self, client: Any) -> None:
        due = self._due.get(client) if client else None
        if due is not None:
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(min(wait, self.max_hold_s))

    def tell(self, client: Any, retry_after_s: int) -> None:
        if not client:
            return
        self._due.pop(client, None)
        if len(self._due) >= self.size:
            self._due.pop(next(iter(self._due)))  # the oldest advice
        self._due[client] = time.monotonic() + retry_after_s

    def forget(self, client: Any) -> None:
        if client:
            self._due.pop(client, None)


class _BodyStalled(Exception):
    pass


class _Disconnected(Exception):
    pass


async def read_body(receive: Receive, timeout_s: float) -> bytes:
    """The whole request body, within `timeout_s` of the first wait for it."""
    chunks: list[bytes] = []
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _Disconnected
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    return b"".join(chunks)
    except TimeoutError:
        raise _BodyStalled from None


def replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the app the body already read, then the connection's own
    messages (a disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive_again() -> Message:
        return pending.pop() if pending else await receive()

    return receive_again


class LoadSheddingMiddleware:
    """Before any body is read: 401 without a valid API key (where keys are set) on the routes
    that need one, 415 for a Content-Type the route does not read (`scehr.service.media_types`),
    then 503 + Retry-After when the model is full. Then the body, under its deadline (408
    when it stalls), and the model's limit again (503 if it filled meanwhile). Which routes
    need a key, read which media types and score which task is read off the app's `routes`."""

    def __init__(self, app: ASGIApp, shedder: LoadShedder, metrics: Metrics,
                 timeout_s: float, api_keys: list[str], routes: Sequence[BaseRoute] = (),
                 body_timeout_s: float = 10.0) -> None:
        self.app = app
        self.keyed = keyed_paths(routes)
        self.bodies = body_routes(routes)
        self.scoring = scoring_routes(routes)
        self.shedder = shedder
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.body_timeout_s = body_timeout_s
        self.api_keys = api_keys
        self.told = RetryAdvice()

    async def _refuse(self, scope: Scope, send: Send, task: str) -> None:
        # The cheapest answer there is: pre-encoded, and logged at DEBUG only (the
        # scehr_overload_rejections_total counter has them), since under overload every
        # microsecond spent refusing is taken from the requests being served.
        self.metrics.overload.labels(task).inc()
        scope["state"]["rejected"] = True
        rid = request_id_var.get() or ""
        body = _REFUSED % rid.encode()
        advice = self.shedder.refuse(task)
        self.told.tell(scope.get("client"), advice)
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(advice).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        task = scoring_task(scope, self.scoring)
        path = scope.get("path", "")
        if self.api_keys and any(p.match(path) for p in self.keyed):
            key = header(scope, b"x-api-key")
            if key is None or not key_matches(key, self.api_keys):
                await send_error(send, 401, ErrorBody(
                    error="unauthorized", request_id=request_id_var.get(), detail=[Problem(
                        loc=[], rule="unauthorized",
                        message="missing or invalid X-API-Key header")]),
                    [(b"www-authenticate", b"APIKey")])
                return
        route = find(self.bodies, scope.get("method", ""), path)
        if route is not None:
            problem = refusal(route, header(scope, b"content-type"))
            if problem is not None:
                if task is not None:
                    scope.setdefault("state", {})["model"] = task
                    self.metrics.validation_errors.labels(task, problem.rule).inc()
                await send_error(send, 415, ErrorBody(
                    error="unsupported_media_type", request_id=request_id_var.get(),
                    detail=[problem]))
                return
        if task is None:
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})["model"] = task
        if self.shedder.full(task):
            # back before its Retry-After on this connection: answered when that time comes,
            # by what the model can take then
            await self.told.hold(scope.get("client"))
            if self.shedder.full(task):
                await self._refuse(scope, send, task)
                return
        try:
            body = await read_body(receive, self.body_timeout_s)
        except _Disconnected:
            return
        except _BodyStalled:
            await send_error(send, 408, ErrorBody(
                error="body_timeout", request_id=request_id_var.get(), detail=[Problem(
                    loc=["body"], rule="body_timeout",
                    message="the request body did not arrive in time",
                    allowed=f"the whole body within {self.body_timeout_s:g} s of the headers")]),
                [(b"connection", b"close")])
            return
        units = cost(len(body))
        if not self.shedder.try_admit(task, units):
            await self._refuse(scope, send, task)
            return
        self.told.forget(scope.get("client"))
        receive = replay(body, receive)
        del body
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.shedder.release(task, completed=status < 500, units=units)
