"""Every error answer is an `ErrorBody` JSON naming the field, the rule and the allowed range."""

from __future__ import annotations

import logging
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from scehr.schemas.payloads import ErrorBody, Problem
from scehr.schemas.tasks import TASK_NAMES
from scehr.service.logs import request_id_var
from scehr.service.pipeline import pydantic_problems

log = logging.getLogger("scehr.errors")


class ApiError(Exception):
    """An answer other than 2xx, raised anywhere in a route."""

    def __init__(self, status: int, error: str, detail: list[Problem] | None = None,
                 headers: dict[str, str] | None = None, message: str | None = None) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.detail = list(detail or [])
        if message is not None:
            self.detail.insert(0, Problem(loc=[], rule=error, message=message))
        self.headers = headers


def error_response(status: int, error: str, detail: list[Problem] | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorBody(error=error, detail=detail or [], request_id=request_id_var.get())
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


def _code(status: int) -> str:
    try:
        return HTTPStatus(status).phrase.lower().replace(" ", "_")
    except ValueError:
        return "error"


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.error, exc.detail, exc.headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = pydantic_problems(list(exc.errors()))
    model = request.scope.get("state", {}).get("model") or request.path_params.get("task")
    if isinstance(model, str) and model in TASK_NAMES:
        for p in problems:
            request.app.state.metrics.validation_errors.labels(model, p.rule).inc()
    log.info("request rejected", extra={"status": 422,
                                        "rules": sorted({p.rule for p in problems})})
    return error_response(422, "validation_error", problems)


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    msg = exc.detail if isinstance(exc.detail, str) else _code(exc.status_code)
    return error_response(exc.status_code, _code(exc.status_code),
                          [Problem(loc=[], rule=_code(exc.status_code), message=msg)],
                          getattr(exc, "headers", None))


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
