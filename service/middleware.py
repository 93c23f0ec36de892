"""Pure ASGI middleware: request id, access log and request metrics; the body-size limit.

Pure ASGI (not BaseHTTPMiddleware) so nothing is buffered and the size limit sees the body as
it streams: a chunked upload without Content-Length is cut off at the limit too.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import time
from collections.abc import Sequence

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scehr.schemas.payloads import ErrorBody, Problem
from scehr.schemas.tasks import TASK_NAMES
from scehr.service.logs import request_id_var
from scehr.service.media_types import BodyRoute, find
from scehr.service.metrics import Metrics

log = logging.getLogger("scehr.access")

_RID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
#: The generator of request ids, seeded by the OS once per process (again in a forked child).
#: Not `uuid.uuid4()`: its `os.urandom` releases the GIL, and under load the event loop's thread
#: then waits for a worker thread's switch interval to get it back, on every request.
_IDS = random.Random()
os.register_at_fork(after_in_child=_IDS.seed)


def new_request_id() -> str:
    """32 hex digits, 128 random bits (uuid4's shape, as logs and clients know it)."""
    return f"{_IDS.getrandbits(128):032x}"


_QUIET = {"/livez", "/readyz", "/metrics"}
#: The status logged and counted for a request whose client went away before its answer
#: started (nginx's "client closed request"): the server did not fail, so it is no 5xx.
CLIENT_CLOSED = 499


async def send_error(send: Send, status: int, body: ErrorBody,
                     headers: list[tuple[bytes, bytes]] | None = None) -> None:
    data = json.dumps(body.model_dump(mode="json")).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": data})


def header(scope: Scope, name: bytes) -> str | None:
    """A request header from the ASGI scope (names are lower-case bytes there)."""
    for k, v in scope.get("headers", []):
        if k == name:
            return v.decode("latin-1")
    return None


def model_label(scope: Scope) -> str:
    """The `model` label and log field: a task of the contract, else `unknown` (never a value
    the caller chose, so neither metrics nor logs grow with what clients send)."""
    model = scope.get("state", {}).get("model") or scope.get("path_params", {}).get("task")
    return model if isinstance(model, str) and model in TASK_NAMES else "unknown"


class RequestContextMiddleware:
    """X-Request-ID (echoed when well-formed, else generated), metrics and one access-log line.

    Labels and log fields come from closed sets only: the route template (of a body route
    also when answered before routing, e.g. by load shedding; `unmatched` for unknown paths), a
    contract task or `unknown`, the status code the server chose. The log line never
    holds the path, the query, the body or any header value other than a well-formed request
    id. Every response carries `Cache-Control: no-store` (predictions and errors echo patient
    data; nothing here is worth caching). A client that disconnects before its answer starts
    (the app was told so by `receive`) is logged and counted as `CLIENT_CLOSED` with
    `client_closed: true`, whatever the app did next (answered into the closed connection,
    or raised `ClientDisconnect`), never as a server error; any other exception is one.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics, bodies: Sequence[BodyRoute] = ()) -> None:
        self.app = app
        self.metrics = metrics
        self.bodies = tuple(bodies)

    def endpoint(self, scope: Scope) -> str:
        """The route template of the request: the router's, else (answered before routing)
        the body route it was for, else `unmatched`."""
        path = getattr(scope.get("route"), "path", None)
        if path is None:
            route = find(self.bodies, scope.get("method", ""), scope.get("path", ""))
            path = route.path if route is not None else None
        return path or "unmatched"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = header(scope, b"x-request-id")
        rid = given if given and _RID.match(given) else new_request_id()
        token = request_id_var.set(rid)
        scope.setdefault("state", {})
        status = 500
        started = closed = False

        async def watch_receive() -> Message:
            nonlocal closed
            message = await receive()
            if message["type"] == "http.disconnect" and not started:
                closed = True
            return message

        async def send_with_id(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status = message["status"]
                started = True
                message["headers"] = [*message.get("headers", []),
                                      (b"x-request-id", rid.encode()),
                                      (b"cache-control", b"no-store")]
            await send(message)

        self.metrics.in_flight.inc()
        t0 = time.perf_counter()
        try:
            await self.app(scope, watch_receive, send_with_id)
        except Exception as e:
            if not (closed and isinstance(e, ClientDisconnect)):  # else: the client left
                closed = False  # the server's own failure, whether or not the client is there
                log.exception("unhandled error")
                if not started:
                    await send_error(send_with_id, 500, ErrorBody(
                        error="internal_error", request_id=rid, detail=[Problem(
                            loc=[], rule="internal_error",
                            message="the server failed; the request id is in its logs")]))
        finally:
            seconds = time.perf_counter() - t0
            self.metrics.in_flight.dec()
            endpoint = self.endpoint(scope)
            model = model_label(scope)
            if closed:
                status = CLIENT_CLOSED
            code = str(status)
            self.metrics.child(self.metrics.requests, endpoint, model, code).inc()
            self.metrics.child(self.metrics.request_seconds, endpoint, model, code).observe(
                seconds)
            quiet = endpoint in _QUIET or scope["state"].get("rejected")
            log.log(logging.DEBUG if quiet else logging.INFO, "request",
                    extra={"method": scope.get("method"), "endpoint": endpoint,
                           "status": status, "model": model,
                           "duration_ms": round(seconds * 1000, 3),
                           **({"client_closed": True} if closed else {})})
            request_id_var.reset(token)


class _TooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """413 for bodies over `max_bytes`, by Content-Length or by counting the streamed chunks."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _error(self) -> ErrorBody:
        return ErrorBody(error="payload_too_large", request_id=request_id_var.get(), detail=[
            Problem(loc=["body"], rule="body_too_large", message="the request body is too large",
                    allowed=f"<= {self.max_bytes} bytes")])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await send_error(send, 413, self._error(), [(b"connection", b"close")])
            return
        received = 0
        exceeded = False
        started = False

        async def counting_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    exceeded = True
                    raise _TooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if exceeded:  # whatever the app answers after the cut-off (e.g. a 400) is dropped
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except _TooLarge:
            pass
        except Exception:
            if not exceeded:
                raise
        if exceeded and not started:
            await send_error(send, 413, self._error(), [(b"connection", b"close")])
