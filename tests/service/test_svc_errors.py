"""Every error class answers JSON (ErrorBody) naming field, rule and range; never a 500."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scehr.service.settings import Settings
from tests.service.conftest import serve, stay

pytestmark = pytest.mark.anyio


def problems(r: httpx.Response) -> list[dict]:
    body = r.json()
    assert set(body) == {"error", "detail", "request_id"}, body
    assert body["request_id"] == r.headers["x-request-id"]
    return body["detail"]


async def test_pydantic_errors_list_every_problem(client: httpx.AsyncClient) -> None:
    body = {"observations": [{"variable": "heart_rate", "time": "soon", "value": 80}],
            "demographics": {"age": 200, "sex": "x"}, "extra": 1}
    r = await client.post("/predict/mortality", json=body)
    assert r.status_code == 422 and r.json()["error"] == "validation_error"
    by_loc = {tuple(p["loc"]): p for p in problems(r)}
    assert by_loc[("body", "demographics", "age")]["allowed"] == "<= 130"
    assert by_loc[("body", "demographics", "sex")]["allowed"] == "'female' or 'male'"
    assert by_loc[("body", "extra")]["rule"] == "extra_forbidden"
    assert any(loc[:4] == ("body", "observations", 0, "time") for loc in by_loc)


async def test_contract_errors_name_field_rule_and_allowed(client: httpx.AsyncClient) -> None:
    body = {"observations": [
        {"variable": "pulse", "time": 1.0, "value": 80},
        {"variable": "temperature", "time": 1.0, "value": 37.0},
        {"variable": "gcs_eye", "time": 1.0, "value": "winks"},
        {"variable": "heart_rate", "time": -2.0, "value": 80},
        {"variable": "glucose", "time": 1.0, "value": 5, "unit": "furlongs"},
    ]}
    r = await client.post("/predict/mortality", json=body)
    assert r.status_code == 422 and r.json()["error"] == "invalid_stay"
    got = {(tuple(p["loc"]), p["rule"]) for p in problems(r)}
    assert got == {
        (("body", "observations", 0, "variable"), "unknown_variable"),
        (("body", "observations", 1, "unit"), "unit_required"),
        (("body", "observations", 2, "value"), "unknown_category"),
        (("body", "observations", 3, "time"), "time_negative"),
        (("body", "observations", 4, "unit"), "unit_not_accepted"),
    }
    assert all(p["allowed"] for p in problems(r))


@pytest.mark.parametrize("raw", [
    b"{not json", b"[]", b"null", b'{"observations": [{"variable": "heart_rate", "time": NaN, '
    b'"value": 1}]}', b'{"observations": [], "wide": {"hours": [], "columns": {}}}',
    b'{"observations": [{"variable": "heart_rate", "time": 1, "value": 1e999}]}',
    b'{"wide": {"hours": [1, 2], "columns": {"heart_rate": [1]}}}',
    b'{"observations": [{"variable": "heart_rate", "time": "2020-01-01T00:00:00", "value": 1}]}',
    b'{"observations": []}', b'{"observations": [{"variable": "", "time": 1, "value": []}]}',
])
async def test_bad_payloads_are_422_never_500(client: httpx.AsyncClient, raw: bytes) -> None:
    r = await client.post("/predict/phenotypes", content=raw,
                          headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert problems(r) and all(p["rule"] for p in problems(r))


@pytest.fixture
async def small_body_client(
        make_settings: Callable[..., Settings]) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(make_settings(max_body_bytes=2048)) as c:
        yield c


async def test_413_by_content_length(small_body_client: httpx.AsyncClient) -> None:
    r = await small_body_client.post("/predict/mortality", json=stay(hours=tuple(range(48))))
    assert r.status_code == 413
    [p] = problems(r)
    assert p["rule"] == "body_too_large" and p["allowed"] == "<= 2048 bytes"


async def test_413_for_chunked_body_without_length(
        small_body_client: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"observations": ['
        for _ in range(200):
            yield b'{"variable": "heart_rate", "time": 1, "value": 80},'
        yield b'{"variable": "heart_rate", "time": 1, "value": 80}]}'

    r = await small_body_client.post("/predict/mortality", content=chunks(),
                                     headers={"content-type": "application/json"})
    assert r.status_code == 413 and problems(r)[0]["rule"] == "body_too_large"
    ok = await small_body_client.post("/predict/mortality", json=stay(hours=(1.0,)))
    assert ok.status_code == 200


async def test_too_many_observations(make_settings: Callable[..., Settings]) -> None:
    async with serve(make_settings(max_observations=5)) as c:
        r = await c.post("/predict/mortality", json=stay())
    assert r.status_code == 422
    assert problems(r)[0]["rule"] == "too_many_observations"
    assert problems(r)[0]["allowed"] == "<= 5"


async def test_unknown_routes_and_methods_are_json(client: httpx.AsyncClient) -> None:
    r = await client.get("/nope")
    assert r.status_code == 404 and problems(r)[0]["rule"] == "not_found"
    r = await client.get("/predict/mortality")
    assert r.status_code == 405 and r.json()["error"] == "method_not_allowed"
    r = await client.post("/predict/sepsis/batch", json={"stays": [stay()]})
    assert r.status_code == 404 and r.json()["error"] == "model_not_found"


async def test_internal_error_is_json_500_with_request_id(
        client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    import scehr.service.scorer as scorer

    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(scorer, "predictions", boom)
    r = await client.post("/predict/mortality", json=stay(), headers={"x-request-id": "abc-1"})
    assert r.status_code == 500 and r.json()["error"] == "internal_error"
    assert r.json()["request_id"] == "abc-1" == r.headers["x-request-id"]


JSON_EDGES = [b'{"a":NaN,"b":-Infinity,"c":1e400}', b'{"a":1,"a":2}', b'{"a":"\\ud800"}',
              b'{"a":"\\ud83d\\ude00"}', b'{"a":"\x01"}', b'{"a":01}', b'\xef\xbb\xbf{}',
              b'{"a":"\xff"}', b'{"a":"\xed\xa0\x80"}', '{"a":"é"}'.encode("utf-16"),
              b'{"a":' + b"9" * 400 + b"}", b'{"a":2.5e-324,"b":0.1,"c":-0.0,"d":1E2}',
              b"[1,]", b'{"a":1}\x0c', b"", b" {} "]


@pytest.mark.parametrize("raw", JSON_EDGES)
def test_the_body_parser_reads_and_refuses_as_json_loads(raw: bytes) -> None:
    """pydantic's parser first, `json.loads` for what it refuses: always json.loads's answer
    (the FHIR and CDS Hooks bodies, whose errors are FastAPI's)."""
    import json

    from scehr.service.interfaces.bodies import loads_json

    def answer(loads: Callable[[bytes], object]) -> object:
        try:
            return repr(loads(raw))
        except ValueError as e:
            return type(e), str(e)

    assert answer(loads_json) == answer(json.loads)


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**80, 2**80) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(value=_JSON_VALUES, ascii_only=st.booleans(), indent=st.sampled_from([None, 1]))
def test_the_body_parser_reads_generated_json_as_json_loads(
        value: object, ascii_only: bool, indent: int | None) -> None:
    """Any JSON text (NaN, Infinity, integers beyond 64 bits, any string, escaped or not):
    the body parser's value is json.loads's, type for type."""
    import json

    from scehr.service.interfaces.bodies import loads_json

    raw = json.dumps(value, ensure_ascii=ascii_only, indent=indent).encode("utf-8",
                                                                        "surrogatepass")
    try:
        want: object = repr(json.loads(raw))
    except ValueError as e:
        want = type(e)
    try:
        got: object = repr(loads_json(raw))
    except ValueError as e:
        got = type(e)
    assert got == want
