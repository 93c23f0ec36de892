"""Strict media types: every route that reads a body reads only the JSON media types it
declares; anything else is 415 naming the header, the rule and the allowed values, before
the body is read (a browser sends text, forms and untyped bodies cross-site without a CORS
preflight)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from scehr.service.examples import CDS_FILE, FHIR_FILE
from scehr.service.media_types import BodyRoute, find, refusal
from scehr.service.settings import Settings
from tests.service.conftest import serve, stay

pytestmark = pytest.mark.anyio
KEY = {"X-API-Key": "s3cret"}
#: What a browser sends cross-site without a preflight, and other types no route reads.
REFUSED = [None, "", "text/plain", "text/plain; charset=utf-8", "multipart/form-data; boundary=x",
           "application/x-www-form-urlencoded", "application/xml", "application/fhir+xml",
           "application/octet-stream", "application/json; charset=latin-1",
           "application/jsonx", "json", "application/json\x7f"]
#: Path parameters of the fixture's routes.
PARAMS = {"task": "mortality", "name": "mortality", "version": "v1",
          "service_id": "scehr-mortality"}


@pytest.fixture
async def keyed(make_settings: Callable[..., Settings]) -> AsyncIterator[httpx.AsyncClient]:
    """With API keys: the admin routes exist."""
    async with serve(make_settings(api_keys="s3cret")) as c:
        yield c


def _body_paths(spec: dict[str, Any]) -> list[str]:
    """Every path of the OpenAPI document whose POST reads a body, with its parameters."""
    return [path.format(**PARAMS) for path, item in spec["paths"].items()
            if "requestBody" in item.get("post", {})]


async def test_every_body_route_refuses_other_media_types_with_415(
        keyed: httpx.AsyncClient) -> None:
    """Driven by the OpenAPI document, so a body route added later is covered: JSON single
    and batch, FHIR, CDS Hooks, V2 infer (both), admin reload, the trajectory routes (JSON
    single and batch, FHIR)."""
    spec = (await keyed.get("/openapi.json")).json()
    paths = _body_paths(spec)
    assert len(paths) == 12, paths
    for path in paths:
        for content_type in REFUSED:
            if content_type is None and path.startswith("/v2/"):
                continue  # read as JSON: Triton's client sends no Content-Type
            headers = {**KEY, **({} if content_type is None else
                                 {"content-type": content_type})}
            r = await keyed.post(path, content=b'{"a": 1}', headers=headers)
            assert r.status_code == 415, (path, content_type, r.text)
            body = r.json()
            assert body["error"] == "unsupported_media_type" and body["request_id"]
            [p] = body["detail"]
            assert p["loc"] == ["header", "content-type"] and p["rule"] == "media_type"
            assert "application/json" in p["allowed"] and "utf-8" in p["allowed"]


async def test_the_json_types_each_route_reads_are_accepted(client: httpx.AsyncClient) -> None:
    """FHIR takes FHIR's own type and plain JSON; every route takes a charset=utf-8
    parameter in any case and quoting; V2 also a request without Content-Type."""
    fhir, cds = FHIR_FILE.read_bytes(), CDS_FILE.read_bytes()
    v2 = json.dumps({"inputs": [{"name": "stay", "shape": [1], "datatype": "BYTES",
                                 "data": [json.dumps(stay())]}]}).encode()
    cases: list[tuple[str, bytes, list[str | None]]] = [
        ("/fhir/predict/mortality", fhir, ["application/fhir+json", "application/json",
                                           "Application/FHIR+JSON; charset=UTF-8",
                                           'application/fhir+json; fhirVersion=4.0']),
        ("/cds-services/scehr-mortality", cds, ["application/json",
                                                'application/json;charset="utf-8"']),
        ("/predict/mortality", json.dumps(stay()).encode(),
         ["application/json", "APPLICATION/JSON ; charset=utf-8"]),
        ("/predict/mortality/batch", json.dumps({"stays": [stay()]}).encode(),
         ["application/json"]),
        ("/v2/models/mortality/infer", v2, ["application/json", None]),
    ]
    for path, body, types in cases:
        for content_type in types:
            headers = {} if content_type is None else {"content-type": content_type}
            r = await client.post(path, content=body, headers=headers)
            assert r.status_code == 200, (path, content_type, r.text)
    r = await client.post("/fhir/predict/mortality", content=fhir,
                          headers={"content-type": "application/json+fhir"})  # the DSTU2 name
    assert r.status_code == 415


async def test_refused_before_the_body_is_read_and_counted(client: httpx.AsyncClient) -> None:
    """The refusal needs the headers only: the body is never pulled from the client; the
    request is counted under its route and model, and its rule among validation errors."""
    pulled = []

    async def body() -> AsyncIterator[bytes]:
        pulled.append(1)
        yield b"{}"

    r = await client.post("/fhir/predict/mortality", content=body(),
                          headers={"content-type": "text/plain"})
    assert r.status_code == 415 and pulled == []
    metrics = (await client.get("/metrics")).text
    assert ('scehr_requests_total{endpoint="/fhir/predict/{task}",model="mortality",'
            'status="415"} 1.0') in metrics
    assert 'scehr_validation_errors_total{model="mortality",rule="media_type"} 1.0' in metrics


async def test_the_key_is_checked_first(keyed: httpx.AsyncClient) -> None:
    r = await keyed.post("/predict/mortality", content=b"{}",
                         headers={"content-type": "text/plain"})
    assert r.status_code == 401


async def test_fhir_xml_under_a_json_type_is_still_415(client: httpx.AsyncClient) -> None:
    r = await client.post("/fhir/predict/mortality", content=b"<Bundle/>",
                          headers={"content-type": "application/fhir+json"})
    assert r.status_code == 415 and r.json()["detail"][0]["rule"] == "fhir_json_only"


def test_the_rule_reads_the_media_type_and_its_charset_only() -> None:
    route = BodyRoute("/x", __import__("re").compile("^/x$"), frozenset({"POST"}),
                      ("application/fhir+json", "application/json"))
    for ok in ("application/json", " application/JSON ;CHARSET=utf-8",
               "application/fhir+json; fhirVersion=4.0; charset=UTF-8"):
        assert refusal(route, ok) is None, ok
    for bad in (None, "", ";", "application/json; charset=utf-16", "application/json/x",
                "text/json"):
        p = refusal(route, bad)
        assert p is not None and p.rule == "media_type", bad
    long = "a" * 10_000 + "/json"
    p = refusal(route, long)
    assert p is not None and "a" * 100 not in p.message  # never echoes an unbounded value
    assert find((route,), "POST", "/x") is route and find((route,), "GET", "/x") is None
