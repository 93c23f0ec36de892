"""A route whose query parameters are validated in one step when they are plainly valid.

FastAPI solves a route's parameters one by one on every request (for each: its alias, whether
its type is a sequence, a multidict look-up, a validation call), six of them on a scoring
route. `QueryRoute` validates the query of a request in one pydantic call against a model built
from the same annotations (the same types, constraints and defaults, so the same values), and
calls the endpoint with them. Anything else — a name it does not know, a name given twice, a
value that fails — goes through FastAPI's own solving, which answers with exactly the errors it
always has.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError, create_model
from starlette.responses import Response

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def query_model(route: APIRoute) -> type[BaseModel] | None:
    """The route's query parameters as one model (field names as the endpoint's, aliases as
    the query's); None when the endpoint takes anything else than `request` and query
    parameters (dependencies, a body, path, header or cookie parameters)."""
    d = route.dependant
    if (d.dependencies or d.body_params or d.path_params or d.header_params
            or d.cookie_params or not d.query_params or d.request_param_name is None):
        return None
    fields: dict[str, Any] = {}
    for f in d.query_params:
        info = f.field_info
        if info.alias not in (None, f.name) or info.validation_alias is not None:
            return None  # only plain names: the query key is the endpoint's argument
        fields[f.name] = (info.annotation, info)
    return create_model(f"{route.name}_query", **fields)


class QueryRoute(APIRoute):
    """An APIRoute that skips FastAPI's per-parameter solving for a plainly valid query."""

    def get_route_handler(self) -> Handler:
        solved = super().get_route_handler()
        model = query_model(self)
        if model is None:
            return solved
        endpoint = self.endpoint
        request_name = self.dependant.request_param_name
        names = frozenset(model.model_fields)

        async def handler(request: Request) -> Response:
            if not request.scope.get("query_string"):  # every parameter at its default
                return await endpoint(**{request_name: request})
            query = request.query_params
            if len(query) != len(query.multi_items()) or not query.keys() <= names:
                return await solved(request)
            try:
                values = model.model_validate(dict(query))
            except ValidationError:
                return await solved(request)  # FastAPI's own errors, field by field
            return await endpoint(**{request_name: request}, **dict(values))

        return handler
