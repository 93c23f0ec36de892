"""POST /predict/{task}/batch: input order, per-stay errors, envelope 422s, same as single."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from scehr.service.settings import Settings
from tests.service.conftest import serve, stay

pytestmark = pytest.mark.anyio


async def test_one_bad_stay_never_fails_the_others(client: httpx.AsyncClient) -> None:
    stays = [
        stay(hr=80, id="a"),
        {"id": "b", "observations": [{"variable": "heart_rate", "time": -1, "value": 80}]},
        stay(hr=120, id="c"),
        {"id": "d", "observations": [{"variable": "heart_rate", "time": 1}]},  # no value
        {"id": "e", "wide": {"hours": [1.0], "columns": {"Heart Rate": [99]}}},
    ]
    r = await client.post("/predict/mortality/batch", json={"stays": stays})
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    assert [i["index"] for i in items] == [0, 1, 2, 3, 4]
    assert [i["id"] for i in items] == ["a", "b", "c", "d", "e"]
    assert [i["prediction"] is not None for i in items] == [True, False, True, False, True]
    [b] = items[1]["errors"]
    assert b["loc"] == ["body", "stays", 1, "observations", 0, "time"]
    assert b["rule"] == "time_negative" and b["allowed"] == ">= 0"
    [d] = items[3]["errors"]
    assert d["loc"] == ["body", "stays", 3, "observations", 0, "value"] and d["rule"] == "missing"
    assert r.json()["model"]["version"] == "v1"


async def test_batch_equals_single(client: httpx.AsyncClient) -> None:
    stays = [stay(hr=70 + 10 * k, hours=(1.0, 5.0 + 20 * k)) for k in range(5)]
    r = await client.post("/predict/phenotypes/batch", json={"stays": stays},
                          params={"explain": "full"})
    batched = [i["prediction"] for i in r.json()["items"]]
    for s, b in zip(stays, batched, strict=True):
        single = (await client.post("/predict/phenotypes", json=s,
                                    params={"explain": "full"})).json()
        assert single == b


@pytest.mark.parametrize("body", [{}, {"stays": []}, {"stays": "x"},
                                  {"stays": [{}], "more": 1}, []])
async def test_malformed_envelope_is_422(client: httpx.AsyncClient, body: object) -> None:
    r = await client.post("/predict/mortality/batch", json=body)
    assert r.status_code == 422 and r.json()["error"] == "validation_error"


async def test_too_many_stays(make_settings: Callable[..., Settings]) -> None:
    async with serve(make_settings(max_batch_stays=2)) as c:
        r = await c.post("/predict/mortality/batch", json={"stays": [stay()] * 3})
    assert r.status_code == 422
    [p] = r.json()["detail"]
    assert (p["loc"], p["rule"], p["allowed"]) == (["body", "stays"], "too_many_stays",
                                                   "1 to 2 stays")


async def test_big_batch_is_split_into_runs_of_max_batch_size(
        make_settings: Callable[..., Settings]) -> None:
    async with serve(make_settings(max_batch_size=4)) as c:
        r = await c.post("/predict/mortality/batch",
                         json={"stays": [stay(hr=60 + k) for k in range(10)]})
        assert r.status_code == 200
        metrics = (await c.get("/metrics")).text
    assert 'scehr_batch_size_bucket{le="4.0",model="mortality"}' in metrics
    line = next(x for x in metrics.splitlines()
                if x.startswith('scehr_batch_size_bucket{le="8.0",model="mortality"}'))
    count = next(x for x in metrics.splitlines()
                 if x.startswith('scehr_batch_size_count{model="mortality"}'))
    assert float(line.split()[-1]) == float(count.split()[-1])  # no run above 4 (8 bucket)
