"""Strict request media types: a route that reads a body reads it only in the media types it
declares, and any other Content-Type is 415 before the body is read.

The types come from the route itself, as the OpenAPI document shows them: the `content` of
its `requestBody` (`openapi_extra`), else `application/json` for a FastAPI body parameter.
So a new body route is covered without a list to keep. A media type may carry `charset`,
which must then be `utf-8` (JSON is UTF-8); other parameters are ignored, as RFC 9110 lets
a recipient do. A request without Content-Type is refused too, unless its route declares
`x-content-type-optional` (Open Inference `infer`: Triton's client sends none).

Why it matters: a browser sends `text/plain`, `multipart/form-data`,
`application/x-www-form-urlencoded` or an untyped body to another site without a CORS
preflight, so a route that scored those would take requests no user meant to send.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from scehr.schemas.payloads import Problem

JSON = "application/json"
#: The `requestBody` extension by which a route reads a request without Content-Type as JSON.
OPTIONAL = "x-content-type-optional"
_TOKEN = re.compile(r"^[a-z0-9!#$&^_.+-]{1,64}/[a-z0-9!#$&^_.+-]{1,64}$")


@dataclass(frozen=True)
class BodyRoute:
    """A route that reads a request body: its template, what matches it, its media types."""

    path: str
    pattern: re.Pattern[str]
    methods: frozenset[str]
    media_types: tuple[str, ...]
    optional: bool = False

    @property
    def allowed(self) -> str:
        return allowed(self.media_types, self.optional)


def allowed(media_types: Iterable[str], optional: bool) -> str:
    """The Content-Types a route reads, as a Problem's `allowed` and the OpenAPI say them."""
    return " or ".join(media_types) + " (charset, when given: utf-8)" + (
        "; or none" if optional else "")


def _request_body(route: Any) -> dict[str, Any] | None:
    body = (getattr(route, "openapi_extra", None) or {}).get("requestBody")
    return body if isinstance(body, dict) else None


def body_route(route: Any) -> BodyRoute | None:
    """The body rule of a route, or None when it reads no body."""
    body = _request_body(route)
    if body is not None:
        types = tuple(str(t).lower() for t in body.get("content", {}))
        optional = bool(body.get(OPTIONAL))
    elif getattr(route, "body_field", None) is not None:
        types = (getattr(route.body_field.field_info, "media_type", JSON).lower(),)
        optional = False
    else:
        return None
    return BodyRoute(route.path, route.path_regex, frozenset(route.methods or ()), types,
                     optional)


def body_routes(routes: Iterable[Any]) -> tuple[BodyRoute, ...]:
    """The body rules of every route that reads a body."""
    return tuple(b for b in map(body_route, routes) if b is not None)


def find(routes: tuple[BodyRoute, ...], method: str, path: str) -> BodyRoute | None:
    """The body route a request goes to, if any."""
    for r in routes:
        if method in r.methods and r.pattern.match(path):
            return r
    return None


def _parse(value: str) -> tuple[str, dict[str, str]]:
    """A Content-Type's media type (lower-case) and parameters (names lower-case)."""
    kind, *params = value.split(";")
    named = {}
    for p in params:
        name, _, v = p.partition("=")
        named[name.strip().lower()] = v.strip().strip('"')
    return kind.strip().lower(), named


def refusal(route: BodyRoute, content_type: str | None) -> Problem | None:
    """Why the request's Content-Type is refused on `route`, or None when it is accepted."""
    if content_type is None and route.optional:
        return None
    kind, params = _parse(content_type or "")
    charset = params.get("charset", "utf-8")
    if kind in route.media_types and charset.lower() == "utf-8":
        return None
    if not kind:
        said = "the request has no Content-Type"
    elif kind in route.media_types:
        said = f"charset {charset[:32]!r} is not accepted: JSON is UTF-8"
    else:
        shown = repr(kind) if _TOKEN.match(kind) else "a malformed media type"
        said = f"Content-Type {shown} is not accepted"
    return Problem(
        loc=["header", "content-type"], rule="media_type",
        message=f"{said}; send the body as JSON (forms, text and XML bodies are not read)",
        allowed=route.allowed)


def document(spec: dict[str, Any]) -> None:
    """The 415 answer, in the OpenAPI document, of every operation that has a request body."""
    for item in spec.get("paths", {}).values():
        for op in item.values():
            body = op.get("requestBody") if isinstance(op, dict) else None
            if not isinstance(body, dict):
                continue
            op.setdefault("responses", {}).setdefault("415", {
                "description": "Content-Type not read here (answered before the body is "
                f"read); allowed: {allowed(body.get('content', {}), bool(body.get(OPTIONAL)))}",
                "content": {JSON: {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}})
