"""Response version 1.2 drops the 1.0 aliases (`probability`, the uncalibrated score, could be
shown by mistake); 1.1, with them, is answered on request (`X-Scehr-Response-Version: 1.1`) for
one release, on the single and batch routes alike, and every other field is byte-identical."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from scehr.schemas.contract import (
    PREVIOUS_RESPONSE_VERSION,
    RESPONSE_VERSION,
    RESPONSE_VERSION_HEADER,
    RESPONSE_VERSIONS,
)
from scehr.service.settings import Settings
from tests.service.conftest import serve, stay

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]
ALIASES = ("probability", "calibrated_probability", "threshold", "prototype")
OLD = {RESPONSE_VERSION_HEADER: PREVIOUS_RESPONSE_VERSION}
#: The aliases as 1.1 writes them: the last four fields of each class result.
ALIAS_TEXT = re.compile(r',"probability":[^,{}]+,"calibrated_probability":[^,{}]+,'
                        r'"threshold":[^,{}]+,"prototype":(?:null|\{[^{}]*\})')
BAD = {"observations": [{"variable": "heart_rate", "time": -1, "value": 80}]}


def predictions_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The predictions of a single or batch answer."""
    if "items" in body:
        return [i["prediction"] for i in body["items"] if i["prediction"] is not None]
    return [body]


async def both(client: httpx.AsyncClient, route: str, body: dict[str, Any],
               **params: str) -> tuple[httpx.Response, httpx.Response]:
    """The answers at the default version and at 1.1."""
    new = await client.post(route, json=body, params=params)
    old = await client.post(route, json=body, params=params, headers=OLD)
    assert new.status_code == old.status_code == 200, (new.text, old.text)
    return new, old


ROUTES = [("/predict/mortality", stay(id="s1")),
          ("/predict/phenotypes/batch", {"stays": [stay(id="a"), BAD, stay(hr=70, id="b")]})]


@pytest.mark.parametrize(("route", "body"), ROUTES, ids=["single", "batch"])
async def test_the_default_answer_is_1_2_without_the_aliases(
        client: httpx.AsyncClient, route: str, body: dict[str, Any]) -> None:
    r = await client.post(route, json=body)
    assert r.status_code == 200, r.text
    assert RESPONSE_VERSION == "1.2" and r.headers[RESPONSE_VERSION_HEADER] == "1.2"
    assert r.json()["response_version"] == "1.2"
    for pred in predictions_of(r.json()):
        assert pred["response_version"] == pred["audit"]["response_version"] == "1.2"
        for res in pred["results"]:
            assert not set(ALIASES) & set(res), res.keys()


@pytest.mark.parametrize(("route", "body"), ROUTES, ids=["single", "batch"])
@pytest.mark.parametrize("explain", ["basic", "top"])
async def test_1_1_on_request_adds_the_aliases_and_changes_nothing_else(
        client: httpx.AsyncClient, route: str, body: dict[str, Any], explain: str) -> None:
    new, old = await both(client, route, body, explain=explain)
    assert old.headers[RESPONSE_VERSION_HEADER] == "1.1" and old.json()["response_version"] == "1.1"
    preds = predictions_of(old.json())
    assert preds
    for pred in preds:
        assert pred["response_version"] == pred["audit"]["response_version"] == "1.1"
        for res in pred["results"]:
            assert list(res)[-4:] == list(ALIASES)
            assert (res["probability"], res["calibrated_probability"]) == (res["score"],
                                                                           res["risk"])
            assert res["threshold"] == res["operating_point"]["threshold"]
            assert res["prototype"]["cluster"] == res["prototypes"][0]["cluster"]
            assert res["prototype"]["label"] in (0, 1)
    # every other byte is the default version's
    cut = ALIAS_TEXT.sub("", old.text).replace('"response_version":"1.1"',
                                               '"response_version":"1.2"')
    assert len(ALIAS_TEXT.findall(old.text)) == sum(len(p["results"]) for p in preds)
    assert cut == new.text


async def test_an_error_item_and_an_abstention_answer_in_the_version_asked() -> None:
    """The shipped mortality model (it declares a data minimum): one heart-rate value
    abstains, a negative time is refused, in a 1.1 batch and a 1.1 single answer."""
    thin = {"observations": [{"variable": "heart_rate", "time": 3.0, "value": 80}]}
    async with serve(Settings(model_dir=REPO / "models", device="cpu")) as client:
        client: httpx.AsyncClient
        b = await client.post("/predict/mortality/batch", json={"stays": [thin, BAD]},
                              headers=OLD)
        one = await client.post("/predict/mortality", json=thin, headers=OLD)
    assert b.status_code == one.status_code == 200, (b.text, one.text)
    [abstained, refused] = b.json()["items"]
    for pred in (abstained["prediction"], one.json()):
        assert pred["status"] == "insufficient_data" and pred["results"] == []
        assert pred["response_version"] == pred["audit"]["response_version"] == "1.1"
    assert b.json()["response_version"] == "1.1"
    assert refused["errors"][0]["rule"] == "time_negative"


@pytest.mark.parametrize("route", ["/predict/mortality", "/predict/mortality/batch"])
@pytest.mark.parametrize("asked", ["1.0", "2", "", "v1.1", "latest"])
async def test_an_unsupported_version_is_422_naming_the_served_ones(
        client: httpx.AsyncClient, route: str, asked: str) -> None:
    body = {"stays": [stay()]} if route.endswith("batch") else stay()
    r = await client.post(route, json=body, headers={RESPONSE_VERSION_HEADER: asked})
    assert r.status_code == 422, r.text
    [p] = r.json()["detail"]
    assert p["loc"] == ["header", RESPONSE_VERSION_HEADER]
    assert p["allowed"] == "'1.2' or '1.1'" and "this release only" in p["message"]


async def test_the_schema_describes_each_version(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    schemas = spec["components"]["schemas"]
    assert not set(ALIASES) & set(schemas["ClassResult"]["properties"])
    old = schemas["ClassResultV1_1"]["properties"]
    assert all(old[a]["deprecated"] is True for a in ALIASES)
    assert schemas["PredictionV1_1"]["properties"]["results"]["items"]["$ref"].endswith(
        "/ClassResultV1_1")
    for path in ("/predict/mortality", "/predict/{task}/batch"):
        op = spec["paths"][path]["post"]
        [header] = [p for p in op["parameters"] if p["in"] == "header"]
        assert header["name"] == RESPONSE_VERSION_HEADER
        assert header["schema"]["enum"] == list(RESPONSE_VERSIONS) == ["1.2", "1.1"]
        ok = op["responses"]["200"]["content"]["application/json"]["schema"]
        refs = {s["$ref"].rsplit("/", 1)[1] for s in ok["anyOf"]}
        assert refs in ({"Prediction", "PredictionV1_1"},
                        {"BatchResponse", "BatchResponseV1_1"})
