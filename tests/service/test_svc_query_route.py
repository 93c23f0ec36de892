"""`QueryRoute`: the same values and the same errors as FastAPI's own parameter solving."""

from typing import Annotated, Literal

import fastapi.routing
import pytest
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from scehr.service.query_route import QueryRoute, query_model


async def endpoint(
    request: Request,
    explain: Annotated[Literal["basic", "top", "full"], Query()] = "top",
    point: Annotated[str | None, Query(max_length=8)] = None,
    threshold: Annotated[float | None, Query(gt=0, lt=1)] = None,
    strict: bool = False,
    version: Annotated[str | None, Query(pattern=r"^[0-9][0-9.]*$")] = None,
) -> JSONResponse:
    return JSONResponse({"explain": explain, "point": point, "threshold": threshold,
                         "strict": strict, "version": version,
                         "path": request.url.path})


def _client(route_class: type[APIRoute]) -> TestClient:
    router = APIRouter()
    router.add_api_route("/score", endpoint, methods=["POST"], route_class_override=route_class)
    app = FastAPI()
    app.include_router(router)
    return TestClient(app)


VALID = ["", "explain=basic", "explain=full&strict=true", "threshold=0.25&point=balanced",
         "strict=yes&version=1.3.1", "strict=0", "threshold=1e-3", "point=%C3%A9t%C3%A9",
         "point="]
INVALID_OR_UNUSUAL = ["explain=", "explain=BASIC", "threshold=1", "threshold=0",
                      "threshold=nan", "threshold=abc", "strict=maybe", "point=123456789",
                      "version=x1", "explain=basic&explain=top", "other=1",
                      "explain=basic&other=1", "threshold=0.5&threshold=2", "=basic", "&&",
                      "explain"]


@pytest.mark.parametrize("query", VALID + INVALID_OR_UNUSUAL)
def test_same_answer_as_fastapi(query: str) -> None:
    fast, plain = _client(QueryRoute), _client(APIRoute)
    a, b = fast.post(f"/score?{query}"), plain.post(f"/score?{query}")
    assert (a.status_code, a.json()) == (b.status_code, b.json())


@pytest.mark.parametrize("query", VALID)
def test_valid_query_skips_the_per_parameter_solving(query: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    client = _client(QueryRoute)
    expected = _client(APIRoute).post(f"/score?{query}").json()

    async def refuse(**_: object) -> None:
        raise AssertionError("FastAPI's parameter solving was called")

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", refuse)
    assert client.post(f"/score?{query}").json() == expected


def test_refused_query_goes_through_fastapi(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    solve = fastapi.routing.solve_dependencies

    async def counted(**kw: object) -> object:
        calls.append(1)
        return await solve(**kw)

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counted)
    r = _client(QueryRoute).post("/score?threshold=2")
    assert r.status_code == 422 and calls
    assert r.json()["detail"][0]["loc"] == ["query", "threshold"]


def test_only_for_query_parameters() -> None:
    """A route with a dependency (or any non-query parameter) keeps FastAPI's solving."""

    async def with_dependency(request: Request, x: int = Depends(lambda: 1)) -> JSONResponse:
        return JSONResponse({})

    router = APIRouter()
    router.add_api_route("/d", with_dependency, route_class_override=QueryRoute)
    assert query_model(router.routes[0]) is None  # type: ignore[arg-type]
    router.add_api_route("/score", endpoint, methods=["POST"], route_class_override=QueryRoute)
    model = query_model(router.routes[1])  # type: ignore[arg-type]
    assert model is not None and set(model.model_fields) == {
        "explain", "point", "threshold", "strict", "version"}


def test_the_scoring_routes_use_it() -> None:
    from scehr.service.routes.predict import router

    single = [r for r in router.routes if isinstance(r, APIRoute)
              and r.path.startswith("/predict/") and not r.path.endswith("/batch")]
    assert single and all(isinstance(r, QueryRoute) and query_model(r) is not None
                          for r in single)
