"""Regression tests for the reliability/security findings (one block per class of finding)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import string
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from scehr import cli as scehr_cli
from scehr.service.load_shedding import UNIT_BYTES, LoadShedder, cost
from scehr.service.settings import Settings
from tests.service.conftest import serve, stay
from tests.service.fixture_model import write_index, write_model, write_model_dir
from tests.service.test_svc_process import free_port

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]
KEY = {"X-API-Key": "s3cret"}


def _series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def _raw(body: Any) -> dict[str, Any]:
    """Body as ASCII JSON, so lone surrogates travel as `\\ud800` escapes, as a client sends."""
    return {"content": json.dumps(body).encode(), "headers": {"content-type": "application/json"}}


# 1 -------------------------------------------------------------- bounded metric labels

@pytest.mark.parametrize("keys", ["", "s3cret"])
async def test_random_task_names_never_grow_metrics(
        make_settings: Callable[..., Settings], keys: str) -> None:
    rng = random.Random(0)

    def name() -> str:
        return "".join(rng.choices(string.ascii_lowercase, k=12))

    async with serve(make_settings(api_keys=keys)) as c:
        async def burst(n: int) -> None:
            for _ in range(n):
                await c.post(f"/predict/{name()}/batch", json={"stays": [stay()]})
                await c.post(f"/predict/{name()}", json=stay())
                await c.get(f"/models/{name()}")
                await c.get(f"/{name()}")
        await burst(3)
        await c.get("/metrics")  # a scrape adds its own series once
        before = (await c.get("/metrics")).text
        await burst(150)
        after = (await c.get("/metrics")).text
    assert _series(after) == _series(before), "client-chosen names became label values"
    assert 'model="unknown"' in after and len(after) < 1.5 * len(before)


# 2 -------------------------------------------------------------- lone surrogates

@pytest.mark.parametrize("bad", [
    {**stay(), "id": "\ud800"},
    {"wide": {"hours": [1.0], "columns": {"heart\ud800": [80.0]}}},
    {"observations": [{"variable": "heart_rate\udfff", "time": 1.0, "value": 80.0}]},
    {**stay(), "\ud800": 1},
])
async def test_lone_surrogate_is_422_and_keeps_valid_stays(client: httpx.AsyncClient,
                                                           bad: dict) -> None:
    r = await client.post("/predict/mortality", **_raw(bad))
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][0] == "body"
    r = await client.post("/predict/mortality/batch",
                          **_raw({"stays": [stay(id="ok"), bad, stay(id="ok2")]}))
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    assert items[0]["prediction"] and items[2]["prediction"] and items[1]["errors"]


# 3 -------------------------------------------------------------- no silent coercion

@pytest.mark.parametrize(("patch", "field"), [
    (lambda s: s["observations"][0].update(value=True), "value"),
    (lambda s: s["observations"][0].update(value=False), "value"),
    (lambda s: s["observations"][0].update(time=True), "time"),
    (lambda s: s["observations"][0].update(time="1.5"), "time"),
    (lambda s: s.update(demographics={"age": "71"}), "age"),
    (lambda s: s.update(demographics={"age": True}), "age"),
    (lambda s: s.update(end_hours="30"), "end_hours"),
])
async def test_booleans_and_numeric_strings_are_rejected(client: httpx.AsyncClient,
                                                         patch: Callable, field: str) -> None:
    s = stay()
    patch(s)
    r = await client.post("/predict/mortality", json=s)
    assert r.status_code == 422, r.text
    locs = [p["loc"] for p in r.json()["detail"]]
    assert any(field in loc for loc in locs), locs


async def test_wide_booleans_are_rejected(client: httpx.AsyncClient) -> None:
    for wide in ({"hours": [True], "columns": {"heart_rate": [80.0]}},
                 {"hours": [1.0], "columns": {"heart_rate": [True]}}):
        r = await client.post("/predict/mortality", json={"wide": wide})
        assert r.status_code == 422, r.text


# 4 -------------------------------------------------------------- non-object batch items

async def test_non_object_batch_items_get_their_own_error(client: httpx.AsyncClient) -> None:
    r = await client.post("/predict/mortality/batch",
                          json={"stays": [stay(id="a"), 42, None, "x", [1], True]})
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    assert items[0]["prediction"]["id"] == "a"
    for i in range(1, 6):
        assert items[i]["errors"][0]["loc"] == ["body", "stays", i], items[i]


# 5 --------------------------------------------------------------- load shedding


async def test_full_model_is_refused_before_the_body_is_read(
        make_settings: Callable[..., Settings]) -> None:
    async with serve(make_settings(max_queue_size=2, retry_after_s=2)) as c:
        shedder = c.app.state.load_shedder  # type: ignore[attr-defined]
        shedder.admitted["mortality"] = 2  # two requests already in the model's pipeline
        r = await c.post("/predict/mortality", content=b"{not json at all",
                         headers={"content-type": "application/json"})
        assert r.status_code == 503 and r.headers["retry-after"] == "2", r.text
        assert r.json()["error"] == "overloaded"
        r = await c.post("/predict/mortality/batch", content=b"[",
                         headers={"content-type": "application/json"})
        assert r.status_code == 503
        assert (await c.post("/predict/phenotypes", json=stay())).status_code == 200
        shedder.admitted["mortality"] = 0
        assert (await c.post("/predict/mortality", json=stay())).status_code == 200
        metrics = (await c.get("/metrics")).text
        assert 'scehr_overload_rejections_total{model="mortality"} 2.0' in metrics


def test_load_shedding_counts_a_request_by_its_body_in_units() -> None:
    assert [cost(n) for n in (0, 1, UNIT_BYTES, UNIT_BYTES + 1, 6_100_000)] == [1, 1, 1, 2, 187]
    a = LoadShedder(limit=64, floor=64)
    assert a.try_admit("mortality", 1) and a.try_admit("mortality", 60)
    assert not a.try_admit("mortality", 4)  # 65 > 64: a batch does not fit
    assert a.try_admit("mortality", 3)  # single stays still do
    a.release("mortality", True, 60)
    a.release("mortality", True, 1)
    assert a.admitted["mortality"] == 3 and a.try_admit("mortality", 61)
    a.release("mortality", True, 61)
    a.release("mortality", True, 3)
    assert a.try_admit("mortality", 500)  # larger than the limit: admitted alone
    assert not a.try_admit("mortality", 1)
    a.release("mortality", True, 500)
    assert a.admitted["mortality"] == 0 and a.rate("mortality", time.monotonic()) > 0


def test_a_lone_request_of_several_units_is_alone() -> None:
    """`alone` counts requests, not units: a single stay of more than UNIT_BYTES of body (a
    long stay, two units) was never alone, so it never ran its ORT row on the loop even with
    nothing else admitted."""
    a = LoadShedder(limit=64, floor=64)
    assert a.try_admit("mortality", cost(UNIT_BYTES + 1)) and a.alone("mortality")
    assert a.try_admit("mortality", 1) and not a.alone("mortality")
    a.release("mortality", True, 1)
    assert a.alone("mortality")
    a.release("mortality", True, cost(UNIT_BYTES + 1))
    assert a.alone("mortality") and a.admitted["mortality"] == 0


async def test_a_large_batch_holds_the_places_of_its_stays_not_one(
        make_settings: Callable[..., Settings]) -> None:
    """Limit 8 units, one request admitted: a batch of ~10 units is refused (before, it held one
    place like a single stay), a single stay is served; alone, the batch is served."""
    hours = tuple(float(h) / 2 for h in range(2 * 47))
    batch = {"stays": [stay(hours=hours, hr=80.0 + i) for i in range(12)]}
    body = json.dumps(batch).encode()
    size, json_type = len(body), {"content-type": "application/json"}
    assert 8 * UNIT_BYTES < size < 16 * UNIT_BYTES, size
    async with serve(make_settings(max_queue_size=8)) as c:
        shedder = c.app.state.load_shedder  # type: ignore[attr-defined]
        shedder.admitted["mortality"] = 1  # one small request in the pipeline
        r = await c.post("/predict/mortality/batch", content=body, headers=json_type)
        assert r.status_code == 503 and r.headers["retry-after"], r.text[:200]
        assert (await c.post("/predict/mortality", json=stay())).status_code == 200
        shedder.admitted["mortality"] = 0
        r = await c.post("/predict/mortality/batch", content=body, headers=json_type)
        assert r.status_code == 200 and len(r.json()["items"]) == 12, r.text[:200]
        assert shedder.peak["mortality"] >= cost(size) and shedder.admitted["mortality"] == 0


async def test_a_lone_request_runs_the_model_on_the_event_loop_only_when_alone(
        make_settings: Callable[..., Settings]) -> None:
    """With nothing else admitted for the model, its one row skips the hand-off to the ORT
    thread; with another request admitted (it could share the run), it is batched."""
    async with serve(make_settings()) as c:
        batcher = c.app.state.registry.handles["mortality"].batcher  # type: ignore[attr-defined]
        run, threads = batcher._run, []

        def recording(inputs):  # type: ignore[no-untyped-def]
            threads.append(threading.get_ident())
            return run(inputs)

        batcher._run = recording
        shedder = c.app.state.load_shedder  # type: ignore[attr-defined]
        alone = await c.post("/predict/mortality", json=stay(), params={"explain": "basic"})
        shedder.admitted["mortality"] = shedder.requests["mortality"] = 1  # another one
        shared = await c.post("/predict/mortality", json=stay(), params={"explain": "basic"})
        shedder.admitted["mortality"] = shedder.requests["mortality"] = 0
    assert alone.status_code == shared.status_code == 200
    assert alone.json()["results"] == shared.json()["results"]
    assert threads[0] == threading.get_ident() != threads[1], threads


async def test_deadline_answers_instead_of_waiting(
        make_settings: Callable[..., Settings]) -> None:
    async with serve(make_settings(request_timeout_s=0.3, max_queue_size=64)) as c:
        batcher = c.app.state.registry.handles["mortality"].batcher  # type: ignore[attr-defined]
        run = batcher._run
        gate = threading.Event()

        def slow(inputs: Any) -> Any:
            gate.wait(5)
            return run(inputs)
        batcher._run = slow
        rs = await asyncio.gather(*(c.post("/predict/mortality", json=stay())
                                    for _ in range(6)))
        gate.set()
        batcher._run = run
        # Answered while the model was still held: had they waited for it, they would be 200s.
        assert {r.status_code for r in rs} <= {503, 504}, [r.text for r in rs]
        for r in rs:
            assert r.json()["error"] in ("deadline_exceeded", "overloaded")
            if r.status_code == 503:
                assert "retry-after" in r.headers
        await asyncio.sleep(0.1)
        assert (await c.post("/predict/mortality", json=stay())).status_code == 200


# 6 -------------------------------------------------------------- heavy work off the loop

async def test_preprocessing_explanations_and_exposition_run_off_the_loop(
        client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    import scehr.service.routes.health as health_routes
    import scehr.service.scorer as scorer
    from tests.service.test_svc_interop import cds_request, fhir_bundle

    loop_thread = threading.get_ident()
    seen: dict[str, int] = {}

    def spy(name: str, fn: Callable) -> Callable:
        def wrapped(*a: Any, **kw: Any) -> Any:
            seen[name] = threading.get_ident()
            return fn(*a, **kw)
        return wrapped

    monkeypatch.setattr(scorer, "prepare", spy("prepare", scorer.prepare))
    monkeypatch.setattr(scorer, "predictions", spy("predictions", scorer.predictions))
    m = client.app.state.metrics  # type: ignore[attr-defined]
    monkeypatch.setattr(m, "render", spy("render", m.render))
    del health_routes
    for url, body in (("/predict/phenotypes/batch?explain=full", {"stays": [stay()] * 4}),
                      ("/predict/phenotypes?explain=full", stay()),
                      ("/fhir/predict/mortality", fhir_bundle()),
                      ("/cds-services/scehr-mortality", cds_request(fhir_bundle()))):
        seen.clear()
        assert (await client.post(url, json=body)).status_code == 200
        assert set(seen) == {"prepare", "predictions"}
        assert loop_thread not in seen.values(), url
    seen.clear()
    assert (await client.get("/metrics")).status_code == 200
    assert seen and loop_thread not in seen.values()


# 7 -------------------------------------------------------------- multiprocess folder


def test_serve_never_deletes_a_folder_it_did_not_create(
        tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    from scehr.service import workers as workers_mod

    mine = tmp_path / "prom"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("keep me")
    (mine / "sub" / "x.txt").write_text("keep me too")
    seen: dict[str, str | None] = {}

    def fake_run(*_: Any, **__: Any) -> None:
        seen["dir"] = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        assert seen["dir"] and Path(seen["dir"]).is_dir()
    monkeypatch.setattr(uvicorn, "run", fake_run)
    monkeypatch.setattr(workers_mod, "run_workers", lambda *_: fake_run() or 0)
    for k in [k for k in os.environ if k.startswith("SCEHR_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("SCEHR_DEVICE", "cpu")  # undone afterwards, like what serve sets
    monkeypatch.setenv("SCEHR_MODEL_DIR", str(model_dir))
    monkeypatch.setenv("SCEHR_WORKERS", "1")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(mine))
    assert scehr_cli.main(["serve", "--model-dir", str(model_dir), "--device", "cpu",
                           "--workers", "2", "--port", str(free_port())]) == 0
    assert (mine / "notes.txt").read_text() == "keep me"
    assert (mine / "sub" / "x.txt").is_file()
    # Without the variable: a private folder of its own, removed afterwards.
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    assert scehr_cli.main(["serve", "--model-dir", str(model_dir), "--device", "cpu",
                           "--workers", "2", "--port", str(free_port())]) == 0
    assert seen["dir"] and seen["dir"] != str(mine) and not Path(seen["dir"]).exists()
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ


def test_dead_worker_series_are_dropped(tmp_path: Path) -> None:
    """A worker killed without its shutdown leaves no live gauge behind in /metrics."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    dead = subprocess.run([sys.executable, "-c", (
        "import os; from service.metrics import Metrics; m = Metrics(); "
        "m.set_model('mortality', 'n', 'v1', 'CPU'); m.in_flight.inc(); print(os.getpid()); "
        "os._exit(0)")], env=env, cwd=REPO, capture_output=True, text=True, timeout=60,
        check=True).stdout.strip()
    out = subprocess.run([sys.executable, "-c", (
        "from service.metrics import Metrics; m = Metrics(); "
        "m.set_model('mortality', 'n', 'v2', 'CPU'); print(m.render()[0].decode())")],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60, check=True).stdout
    assert f'pid="{dead}"' not in out
    assert 'version="v2"' in out and 'version="v1"' not in out
    assert "scehr_in_flight_requests 0.0" in out


# 8 -------------------------------------------------------------- reload confinement

@pytest.mark.parametrize("version", ["../../../x/y", "/etc", "a/b", "..", "a\\b", "v1/../v2"])
async def test_reload_version_is_confined(tmp_path: Path, version: str) -> None:
    write_model_dir(tmp_path / "models")
    outside = write_model(tmp_path / "elsewhere", "mortality", "v9")
    assert outside.is_dir()
    async with serve(Settings(model_dir=tmp_path / "models", device="cpu",
                              api_keys="s3cret")) as c:
        r = await c.post("/admin/models/mortality/reload", json={"version": version},
                         headers=KEY)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", "version"]
        p = await c.post("/predict/mortality", json=stay(), headers=KEY)
        assert p.json()["model"]["version"] == "v1"


# 9 -------------------------------------------------------------- corrupt model at start

def _corrupt_onnx(folder: Path) -> None:
    """Garbage in model.onnx with the manifest's sha256 updated to match it."""
    from scehr.schemas.manifest import sha256_file

    (folder / "model.onnx").write_bytes(b"\x08\x07garbage" * 100)
    m = json.loads((folder / "manifest.json").read_text())
    m["onnx"]["sha256"] = sha256_file(folder / "model.onnx")
    (folder / "manifest.json").write_text(json.dumps(m))


def _swap_anchors(folder: Path) -> None:
    m = json.loads((folder / "manifest.json").read_text())
    m["anchors"]["u"], m["anchors"]["v"] = m["anchors"]["v"], m["anchors"]["u"]
    (folder / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("damage", [_corrupt_onnx, _swap_anchors])
def test_corrupt_model_at_start_exits_1_with_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        damage: Callable[[Path], None]) -> None:
    import uvicorn

    write_model(tmp_path, "mortality", "v1", seed=1)
    write_index(tmp_path, [("mortality", "v1")])
    damage(tmp_path / "mortality" / "v1")
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: None)
    for k in [k for k in os.environ if k.startswith("SCEHR_")]:
        monkeypatch.delenv(k)
    for k in ("SCEHR_MODEL_DIR", "SCEHR_DEVICE", "SCEHR_WORKERS"):
        monkeypatch.setenv(k, "")
    assert scehr_cli.main(["serve", "--model-dir", str(tmp_path), "--device", "cpu"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("scehr serve:"), err


async def test_failed_model_is_not_retryable_503(tmp_path: Path) -> None:
    """In-process (no `scehr serve`): a model that failed for good is a 500, not retry-later."""
    write_model(tmp_path, "mortality", "v1", seed=1)
    write_index(tmp_path, [("mortality", "v1")])
    _corrupt_onnx(tmp_path / "mortality" / "v1")
    async with serve(Settings(model_dir=tmp_path, device="cpu"), wait=False) as c:
        for _ in range(200):
            if "failed" in (await c.get("/readyz")).json()["models"]["mortality"]:
                break
            await asyncio.sleep(0.01)
        r = await c.post("/predict/mortality", json=stay())
        assert r.status_code == 500 and "retry-after" not in r.headers
        assert r.json()["error"] == "model_failed"


# failing ORT batch -------------------------------------------------------------

async def test_failing_ort_batch_is_5xx_with_request_id_and_later_ones_succeed(
        client: httpx.AsyncClient) -> None:
    batcher = client.app.state.registry.handles["mortality"].batcher  # type: ignore[attr-defined]
    run = batcher._run
    calls = {"n": 0}

    def fail_once(inputs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("ORT failed")
        return run(inputs)
    batcher._run = fail_once
    r = await client.post("/predict/mortality", json=stay(), headers={"X-Request-ID": "abc-1"})
    assert r.status_code == 500 and r.json()["request_id"] == "abc-1"
    assert r.json()["error"] == "inference_failed"
    assert (await client.post("/predict/mortality", json=stay())).status_code == 200
    assert (await client.post("/predict/phenotypes", json=stay())).status_code == 200


# 10 -------------------------------------------------------------- smaller ones

async def test_openapi_documents_400_and_the_one_form_rule(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    for path in ("/predict/mortality", "/predict/phenotypes", "/predict/{task}/batch"):
        assert "400" in spec["paths"][path]["post"]["responses"], path
    stay_schema = spec["components"]["schemas"]["StayPayload"]
    assert {tuple(s["required"]) for s in stay_schema["oneOf"]} == {("observations",),
                                                                    ("wide",)}


async def test_patient_data_is_not_cached(client: httpx.AsyncClient) -> None:
    for r in (await client.post("/predict/mortality", json=stay()),
              await client.post("/predict/mortality/batch", json={"stays": [stay()]}),
              await client.post("/predict/mortality", json={"x": 1})):
        assert r.headers["cache-control"] == "no-store"


async def test_docs_models_and_metrics_can_be_closed(
        make_settings: Callable[..., Settings]) -> None:
    async with serve(make_settings(open_docs=False, open_models=False,
                                   open_metrics=False)) as c:
        for url in ("/docs", "/openapi.json", "/redoc", "/models", "/models/mortality",
                    "/metrics"):
            assert (await c.get(url)).status_code == 404, url
        assert (await c.get("/livez")).status_code == 200
        assert (await c.post("/predict/mortality", json=stay())).status_code == 200


async def test_models_shows_no_absolute_path(client: httpx.AsyncClient) -> None:
    body = (await client.get("/models")).text
    root = str(client.app.state.settings.model_dir)  # type: ignore[attr-defined]
    assert root not in body
    assert (await client.get("/models/mortality")).json()["path"] == "mortality/v1"


async def test_request_id_shape_and_closed_set_logs(
        client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    for bad in ("x" * 200, "a b", "<script>", "é"):
        r = await client.get("/livez", headers={"X-Request-ID": bad.encode()})
        assert r.headers["x-request-id"] != bad and len(r.headers["x-request-id"]) == 32
    logger = logging.getLogger("scehr")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.DEBUG, logger="scehr"):
            await client.post("/predict/zz-caller-segment/batch", json={"stays": [stay()]})
            await client.post("/predict/zz-caller-segment", json=stay())
    finally:
        logger.removeHandler(caplog.handler)
    text = " ".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert caplog.records and "zz-caller-segment" not in text


async def test_unparsable_manifest_on_reload_is_manifest_invalid(tmp_path: Path) -> None:
    write_model_dir(tmp_path)
    bad = tmp_path / "mortality" / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text("{ not json")
    async with serve(Settings(model_dir=tmp_path, device="cpu", api_keys="s3cret")) as c:
        r = await c.post("/admin/models/mortality/reload", json={"path": "mortality/bad"},
                         headers=KEY)
        assert r.status_code == 422 and r.json()["detail"][0]["rule"] == "manifest_invalid"



async def test_a_large_request_scored_in_chunks_answers_as_in_one_piece(
        make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch) -> None:
    """40 stays (two refused, in different chunks) with explain=full, as a JSON batch and as
    Open Inference `stay` tensors: chunks of 7 and of 16 (the default) answer exactly what one
    piece does, items and outputs in input order, the refusals at their own index."""
    import scehr.service.scorer as scorer_module

    stays = [stay(hr=70.0 + i) for i in range(40)]
    stays[3]["observations"][0]["value"] = "not a number"
    stays[30]["observations"] = "none"
    v2 = {"inputs": [{"name": "stay", "shape": [40], "datatype": "BYTES",
                      "data": [json.dumps(s) for s in stays]}]}
    answers = []
    for chunk in (10_000, 7, scorer_module.CHUNK_STAYS):
        monkeypatch.setattr(scorer_module, "CHUNK_STAYS", chunk)
        async with serve(make_settings()) as c:
            batch = await c.post("/predict/mortality/batch", json={"stays": stays},
                                 params={"explain": "full"})
            oip = await c.post("/v2/models/mortality/infer", json=v2)
        assert batch.status_code == 200, batch.text[:300]
        items = batch.json()["items"]
        assert [i["index"] for i in items] == list(range(40))
        assert [i for i, item in enumerate(items) if item.get("errors")] == [3, 30]
        for item in items:  # the request ids and times of each run differ
            if item.get("prediction"):
                item["prediction"].pop("audit", None)
        answers.append((items, oip.status_code, oip.json()))
    assert answers[0] == answers[1] == answers[2]


async def test_a_heavy_requests_objects_are_freed_off_the_loop_one_at_a_time(
        client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dropped at once on the event loop's thread when a route returns, a large batch's
    payloads and predictions stalled `/livez` for 100-200 ms: each heavy route empties its
    large lists in a worker thread instead (JSON batch, Open Inference stays, FHIR)."""
    import scehr.service.offload as offload
    from tests.service.test_svc_interop import fhir_bundle

    loop_thread = threading.get_ident()
    calls: list[tuple[int, list[int], list[list[Any]]]] = []
    real = offload.release

    def spy(*heaps: list[Any]) -> None:
        sizes = [len(h) for h in heaps]
        real(*heaps)
        calls.append((threading.get_ident(), sizes, list(heaps)))

    monkeypatch.setattr(offload, "release", spy)
    stays = [stay(hours=tuple(float(h) for h in range(48)), hr=70.0 + i) for i in range(20)]
    v2 = {"inputs": [{"name": "stay", "shape": [20], "datatype": "BYTES",
                      "data": [json.dumps(s) for s in stays]}]}
    assert len(json.dumps(v2)) > 64 * 1024  # heavy: over SCEHR_OFFLOAD_BYTES (and 20 stays)
    for url, body, least in (("/predict/mortality/batch?explain=full", {"stays": stays}, 20),
                             ("/v2/models/mortality/infer", v2, 20),
                             ("/fhir/predict/mortality", fhir_bundle(), 10)):
        calls.clear()
        r = await client.post(url, json=body)
        assert r.status_code == 200, r.text[:200]
        [(thread, sizes, heaps)] = calls
        assert thread != loop_thread and min(sizes) >= 1 and max(sizes) >= least, url
        assert all(h == [] for h in heaps), url
