"""Optional API-key auth: `X-API-Key` compared in constant time against every configured key."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader

from scehr.service.errors import ApiError

_header = APIKeyHeader(name="X-API-Key", auto_error=False,
                       description="Required when the server has SCEHR_API_KEYS set")


def key_matches(given: str, keys: list[str]) -> bool:
    """Compare with every key (no early exit), so timing says nothing about which matched."""
    g = given.encode()
    ok = False
    for k in keys:
        ok |= hmac.compare_digest(g, k.encode())
    return ok


async def require_api_key(request: Request,
                    key: Annotated[str | None, Depends(_header)] = None) -> None:
    """401 unless no keys are configured or the header holds one of them."""
    keys = [k.get_secret_value() for k in request.app.state.settings.api_keys]
    if not keys:
        return
    if key is None or not key_matches(key, keys):
        raise ApiError(401, "unauthorized", message="missing or invalid X-API-Key header",
                       headers={"WWW-Authenticate": "APIKey"})


ApiKey = Annotated[None, Depends(require_api_key)]
#: `openapi_extra` of a route that needs the key but checks none itself (the load-shedding
#: middleware does, before the body is read): the same security entry `ApiKey` gives.
API_KEY_SECURITY = {"security": [{_header.scheme_name: []}]}
#: The OpenAPI security scheme that entry names (what an `ApiKey` dependency declares).
API_KEY_SCHEME = {_header.scheme_name: _header.model.model_dump(mode="json", by_alias=True,
                                                                exclude_none=True)}


def route_needs_key(route: object) -> bool:
    """Whether a route declares that it needs the API key: an `ApiKey` dependency, or the
    `API_KEY_SECURITY` entry in its `openapi_extra`. The load-shedding middleware checks the
    key of exactly these routes before their body is read."""
    extra = getattr(route, "openapi_extra", None) or {}
    if extra.get("security") == API_KEY_SECURITY["security"]:
        return True
    dependant = getattr(route, "dependant", None)
    stack = [] if dependant is None else [dependant]
    while stack:
        d = stack.pop()
        if d.call is require_api_key:
            return True
        stack.extend(d.dependencies)
    return False
