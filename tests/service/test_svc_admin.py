"""API keys and POST /admin/models/{task}/reload: atomic swap, in-flight requests, rejection."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from scehr.service.settings import Settings
from tests.service.conftest import serve, stay
from tests.service.fixture_model import write_model, write_model_dir

pytestmark = pytest.mark.anyio
KEY = {"X-API-Key": "s3cret"}


@pytest.fixture
async def admin(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """Its own model dir, since reload tests add broken models to it."""
    write_model_dir(tmp_path)
    async with serve(Settings(model_dir=tmp_path, device="cpu", api_keys="other, s3cret",
                              max_queue_delay_ms=1)) as c:
        yield c


async def test_admin_routes_are_off_without_keys(client: httpx.AsyncClient) -> None:
    r = await client.post("/admin/models/mortality/reload", json={"version": "v2"})
    assert r.status_code == 404


async def test_keys_guard_predict_and_admin(admin: httpx.AsyncClient) -> None:
    for url, body in (("/predict/mortality", stay()),
                      ("/predict/mortality/batch", {"stays": [stay()]}),
                      ("/admin/models/mortality/reload", {"version": "v2"})):
        for headers in ({}, {"X-API-Key": "wrong"}, {"X-API-Key": ""}):
            r = await admin.post(url, json=body, headers=headers)
            assert r.status_code == 401, (url, headers)
            assert r.json()["error"] == "unauthorized"
    assert (await admin.post("/predict/mortality", json=stay(), headers=KEY)).status_code == 200
    other = {"X-API-Key": "other"}
    assert (await admin.post("/predict/mortality", json=stay(), headers=other)).status_code == 200
    assert (await admin.get("/models")).status_code == 200  # read-only routes stay open


async def test_every_route_that_declares_the_key_is_checked_before_its_body(
        admin: httpx.AsyncClient) -> None:
    """The pre-body check follows the routes' own declaration (an `ApiKey` dependency or the
    OpenAPI security entry): scoring on every interface and admin are 401 before their body
    is even parsed; discovery and metadata of the same interfaces stay open."""
    from scehr.service.load_shedding import keyed_paths
    from scehr.service.routes import cds_hooks, fhir, oip, predict

    declared = keyed_paths([r for m in (predict, fhir, cds_hooks, oip) for r in m.router.routes])
    # 3 single-stay tasks, batch, FHIR, CDS service, 2 V2 infer, the mortality trajectory
    # (single, batch, FHIR)
    assert len(declared) == 11
    for url in ("/predict/mortality", "/predict/mortality/batch", "/fhir/predict/mortality",
                "/cds-services/scehr-mortality", "/v2/models/mortality/infer",
                "/v2/models/mortality/versions/v1/infer", "/admin/models/mortality/reload"):
        r = await admin.post(url, content=b"{not json", headers={"content-type":
                                                                 "application/json"})
        assert r.status_code == 401 and r.json()["error"] == "unauthorized", url
    for url in ("/cds-services", "/v2/models/mortality", "/v2/health/ready", "/models"):
        assert (await admin.get(url)).status_code == 200, url


async def test_reload_swaps_and_inflight_requests_finish_on_old(
        admin: httpx.AsyncClient) -> None:
    handle = admin.app.state.registry.handles["mortality"]  # type: ignore[attr-defined]
    handle.batcher.max_queue_delay = 0.3  # hold the next request in the queue
    inflight = asyncio.ensure_future(admin.post("/predict/mortality", json=stay(),
                                                headers=KEY))
    await asyncio.sleep(0.05)
    r = await admin.post("/admin/models/mortality/reload", json={"version": "v2"}, headers=KEY)
    assert r.status_code == 200, r.text
    assert r.json()["previous_version"] == "v1" and r.json()["model"]["version"] == "v2"
    old = (await inflight).json()
    assert old["model"]["version"] == "v1" and old["model"]["loss"] == "cbce"
    new = (await admin.post("/predict/mortality", json=stay(), headers=KEY)).json()
    assert new["model"]["version"] == "v2" and new["model"]["loss"] == "csce"
    assert (await admin.get("/models/mortality")).json()["version"] == "v2"
    metrics = (await admin.get("/metrics")).text
    assert 'scehr_model_info{name="fixture-mortality-csce",provider="CPUExecutionProvider",' \
        'task="mortality",version="v2"} 1.0' in metrics
    assert 'version="v1"} 1.0' not in metrics.split("scehr_model_info")[-1].replace(
        "phenotypes", "")
    assert 'scehr_model_reloads_total{model="mortality",outcome="ok"} 1.0' in metrics


async def test_reload_by_path(admin: httpx.AsyncClient) -> None:
    r = await admin.post("/admin/models/mortality/reload", json={"path": "mortality/v2"},
                         headers=KEY)
    assert r.status_code == 200 and r.json()["model"]["version"] == "v2"


@pytest.mark.parametrize(("make", "body", "status", "rule"), [
    (None, {"version": "v9"}, 404, "model_not_found"),
    (None, {"path": "../../etc"}, 422, "path_outside_model_dir"),
    (None, {"path": "phenotypes/v1"}, 422, "task_mismatch"),
    (lambda d: write_model(d, "mortality", "bad", corrupt_sha=True), {"path": "mortality/bad"},
     422, "sha256_mismatch"),
    (lambda d: write_model(d, "mortality", "bad", contract_version="2.0"),
     {"path": "mortality/bad"}, 422, "contract_version"),
    (lambda d: write_model(d, "mortality", "bad", mangle={"anchors": {
        "u": [[0.0] * 16], "v": [[1.0] * 16]}}), {"path": "mortality/bad"}, 422,
     "anchors_mismatch"),
    (lambda d: write_model(d, "mortality", "bad", uses_static=False, mangle={"encoder": {
        "name": "x", "hparams": {}, "out_dim": 16, "uses_static": True}}),
     {"path": "mortality/bad"}, 422, "graph_inputs"),
])
async def test_rejected_reload_keeps_old_model(
        admin: httpx.AsyncClient, make: Callable[[Path], Path] | None, body: dict, status: int,
        rule: str) -> None:
    root = admin.app.state.settings.model_dir  # type: ignore[attr-defined]
    if make is not None:
        make(root)
    r = await admin.post("/admin/models/mortality/reload", json=body, headers=KEY)
    assert r.status_code == status, r.text
    err = r.json()
    assert err["error"] == "model_rejected" and err["detail"][0]["rule"] == rule
    assert "keeps serving" in err["detail"][0]["message"]
    p = await admin.post("/predict/mortality", json=stay(), headers=KEY)
    assert p.status_code == 200 and p.json()["model"]["version"] == "v1"
    shutil.rmtree(root / "mortality" / "bad", ignore_errors=True)


async def test_reload_body_must_name_one_source(admin: httpx.AsyncClient) -> None:
    for body in ({}, {"version": "v2", "path": "mortality/v2"}):
        r = await admin.post("/admin/models/mortality/reload", json=body, headers=KEY)
        assert r.status_code == 422 and r.json()["error"] == "validation_error"
