"""GET /models, /models/{task}, /livez, /readyz (503 while loading or failed), /openapi.json."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from service.registry import Registry
from service.settings import Settings
from tests.service.conftest import serve, stay, wait_ready
from tests.service.fixture_model import write_index, write_model

pytestmark = pytest.mark.anyio


async def test_models_lists_provider_and_metrics(client: httpx.AsyncClient) -> None:
    body = (await client.get("/models")).json()
    tasks = {m["task"]: m for m in body["models"]}
    assert set(tasks) == {"mortality", "phenotypes"}
    m = tasks["mortality"]
    assert m["provider"] == "CPUExecutionProvider" and m["device"] == "cpu"
    assert m["metrics"]["auroc"]["value"] == 0.85 and m["loss"] == "cbce"
    assert m["neutralised_channels"] == ["capillary_refill_rate"]
    assert m["uses_static"] is True and m["dynamic_length"] is False
    assert {(a["task"], a["version"], a["default"]) for a in body["available"]} == {
        ("mortality", "v1", True), ("mortality", "v2", False), ("phenotypes", "v1", True)}
    one = (await client.get("/models/phenotypes")).json()
    assert one["label_names"][0] == "phenotype_00" and one["dynamic_length"] is True
    r = await client.get("/models/sepsis")
    assert r.status_code == 404 and r.json()["error"] == "model_not_found"


async def test_livez_and_readyz(client: httpx.AsyncClient) -> None:
    assert (await client.get("/livez")).json() == {"status": "ok", "models": {}}
    r = await client.get("/readyz")
    assert r.status_code == 200
    assert r.json() == {"status": "ready", "models": {"mortality": "ready",
                                                       "phenotypes": "ready"},
                        "workers": "1/1 workers ready"}


async def test_readyz_503_until_loaded_and_predict_503_meanwhile(
        make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()
    real = Registry._load

    def slow_load(self: Registry, folder: Path, task: str):
        gate.wait(10)
        return real(self, folder, task)

    monkeypatch.setattr(Registry, "_load", slow_load)
    async with serve(make_settings(tasks="mortality"), wait=False) as c:
        assert (await c.get("/livez")).status_code == 200
        r = await c.get("/readyz")
        assert r.status_code == 503 and r.json()["models"] == {"mortality": "loading"}
        p = await c.post("/predict/mortality", json=stay())
        assert p.status_code == 503 and p.json()["error"] == "model_not_ready"
        assert "retry-after" in p.headers
        r = await c.get("/models/mortality")
        assert r.status_code == 503
        gate.set()
        await wait_ready(c)
        assert (await c.post("/predict/mortality", json=stay())).status_code == 200
        r = await c.post("/predict/phenotypes", json=stay())  # not configured here
        assert r.status_code == 404


async def test_model_failing_warmup_keeps_readyz_503(tmp_path: Path) -> None:
    write_model(tmp_path, "phenotypes", "v1", ignore_lengths=True)  # wrong for batch > 1
    write_index(tmp_path, [("phenotypes", "v1")])
    async with serve(Settings(model_dir=tmp_path, device="cpu"), wait=False) as c:
        for _ in range(200):
            body = (await c.get("/readyz")).json()
            if body["models"]["phenotypes"] != "loading":
                break
            await asyncio.sleep(0.01)
        assert body["status"] == "not_ready"
        assert body["models"]["phenotypes"].startswith("failed: a stay scored alone differs")


async def test_openapi_has_every_route_and_examples(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    assert {"/predict/mortality", "/predict/phenotypes", "/predict/{task}/batch", "/models",
            "/models/{task}", "/livez", "/readyz", "/metrics"} <= set(spec["paths"])
    op = spec["paths"]["/predict/mortality"]["post"]
    examples = op["requestBody"]["content"]["application/json"]["examples"]
    assert {"long", "wide"} <= set(examples)
    assert op["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "ErrorBody")
    assert "/admin/models/{task}/reload" not in spec["paths"]  # no key configured
    assert "X-API-Key" in str(spec["components"]["securitySchemes"])
