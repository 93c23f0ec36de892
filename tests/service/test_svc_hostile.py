"""Hostile clients against the new surface, bounded for CI: stalled bodies on a real server
process, interop inputs that must be refused before their expensive parse or that used to end
in a 500."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scehr.schemas.payloads import StayPayload
from scehr.service.app import create_app
from scehr.service.pipeline import prepare
from scehr.service.settings import Settings
from tests.service.conftest import serve, stay, wait_ready, wait_until_serving
from tests.service.fhir_writer import example_bundle, example_cds_request
from tests.service.test_svc_process import REPO, free_port, scehr_command

pytestmark = pytest.mark.anyio


@pytest.fixture
def one_worker(model_dir: Path, tmp_path: Path) -> Iterator[tuple[str, int, Path]]:
    """`scehr serve` with one worker and a 3 s body deadline: base URL, port, log file."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCEHR_")}
    env.update(SCEHR_BODY_TIMEOUT_S="3", SCEHR_LOG_LEVEL="INFO",
               PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prom"))
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*scehr_command(), "serve", "--port", str(port), "--model-dir",
                                 str(model_dir), "--device", "cpu", "--workers", "1"],
                                cwd=REPO, env=env, stdout=out, stderr=out)
    try:
        wait_until_serving(proc, f"http://127.0.0.1:{port}", log.read_text)
        yield f"http://127.0.0.1:{port}", port, log
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _stall(port: int, path: str = "/predict/mortality") -> socket.socket:
    """Headers announcing 100,000 bytes of body, then one byte, then nothing."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              "Content-Length: 100000\r\n\r\n{".encode())
    return s


@pytest.mark.slow
def test_stalled_bodies_never_lock_other_clients_out(
        one_worker: tuple[str, int, Path]) -> None:
    """64 connections whose body stalls hold no load-shedding slot: other clients are served at
    once; each stalled one gets 408 `body_timeout` once the body deadline passes, and is
    closed."""
    base, port, log = one_worker
    stalled = [_stall(port) for _ in range(64)]
    try:
        time.sleep(0.5)  # all 64 are past their headers, waiting for their bodies
        with httpx.Client(base_url=base, timeout=10) as c:
            for i in range(5):
                r = c.post("/predict/mortality", json=stay(id=f"polite-{i}"))
                assert r.status_code == 200, r.text
        first = stalled[0]
        first.settimeout(15)  # the body deadline is 3 s: the answer comes well before this
        answer = b""
        while b"\r\n\r\n" not in answer or b"}" not in answer.split(b"\r\n\r\n", 1)[1]:
            chunk = first.recv(65536)
            if not chunk:
                break
            answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer[:300]
        assert b"body_timeout" in body and b"connection: close" in head.lower()
        assert first.recv(65536) == b""  # closed by the server
    finally:
        for s in stalled:
            s.close()
    assert "Traceback" not in log.read_text()


# ------------------------------------------------------------------ clients that leave

#: Every route that reads a body, with the template its requests are counted under.
_BODY_ROUTES = {"/predict/mortality": "/predict/mortality",
                "/predict/mortality/batch": "/predict/{task}/batch",
                "/fhir/predict/mortality": "/fhir/predict/{task}",
                "/cds-services/scehr-mortality": "/cds-services/{service_id}",
                "/v2/models/mortality/infer": "/v2/models/{name}/infer",
                "/v2/models/mortality/versions/v1/infer":
                    "/v2/models/{name}/versions/{version}/infer",
                "/admin/models/mortality/reload": "/admin/models/{task}/reload"}


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _in_flight(app: Any) -> float:
    text = app.state.metrics.render()[0].decode()
    return float(next(line.split()[-1] for line in text.splitlines()
                      if line.startswith("scehr_in_flight_requests ")))


def test_a_client_that_leaves_before_its_answer_is_499_never_a_5xx(
        make_settings: Callable[..., Settings]) -> None:
    """Connections to a real uvicorn server on 127.0.0.1 that send their headers, no body,
    and close: each is one access-log line with status 499 and `client_closed`, counted as
    499 under its route (the 5xx series stay empty), with no error logged; the server then
    answers as before."""
    import threading

    import uvicorn

    app = create_app(make_settings(api_keys="s3cret"))
    access = _Records()  # every record of the service's loggers (the access log is one)
    logging.getLogger("scehr").addHandler(access)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    per_route = 43  # 301 connections in all
    total = per_route * len(_BODY_ROUTES)
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        base = f"http://127.0.0.1:{port}"
        while httpx.get(f"{base}/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        access.records.clear()
        sockets = []
        for path in _BODY_ROUTES:
            for _ in range(per_route):
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nX-API-Key: s3cret\r\n"
                          "Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
                          .encode())
                sockets.append(s)
        deadline = time.monotonic() + 30
        while _in_flight(app) < total:  # every request has reached the app
            assert time.monotonic() < deadline, _in_flight(app)
            time.sleep(0.05)
        for s in sockets:
            s.close()
        while _in_flight(app) > 0:
            assert time.monotonic() < deadline, _in_flight(app)
            time.sleep(0.05)
        lines = [r for r in access.records if r.getMessage() == "request"]
        assert len(lines) == total
        assert {(r.status, getattr(r, "client_closed", None))  # type: ignore[attr-defined]
                for r in lines} == {(499, True)}
        by_route = {r.endpoint: 0 for r in lines}  # type: ignore[attr-defined]
        for r in lines:
            by_route[r.endpoint] += 1  # type: ignore[attr-defined]
        assert by_route == {t: per_route for t in _BODY_ROUTES.values()}
        assert not [r for r in access.records if r.levelno >= logging.WARNING]
        metrics = httpx.get(f"{base}/metrics").text
        counted = [line for line in metrics.splitlines()
                   if line.startswith("scehr_requests_total{")]
        # (/readyz answers 503 until the model is loaded: the designed answer, not an error)
        assert not [line for line in counted if 'status="5' in line
                    and 'endpoint="/readyz"' not in line], counted
        assert sum(float(line.split()[-1]) for line in counted
                   if 'status="499"' in line) == total
        r = httpx.post(f"{base}/predict/mortality", json=stay(), headers={"X-API-Key": "s3cret"})
        assert r.status_code == 200, r.text
    finally:
        logging.getLogger("scehr").removeHandler(access)
        server.should_exit = True
        thread.join(timeout=10)


# ------------------------------------------------------------------ V2 numbers and types


def _v2_tensors(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    """A valid V2 tensor request's inputs for one stay, as plain JSON lists."""
    spec = client.app.state.registry.get("mortality").model.spec  # type: ignore[attr-defined]
    prep = prepare(spec, [StayPayload.model_validate(stay())])
    assert prep.inputs is not None
    out = []
    for name, arr, dtype in (("x", prep.inputs.x, "FP32"), ("lengths", prep.inputs.lengths,
                                                             "INT64"),
                             ("static", prep.inputs.static, "FP32")):
        if arr is not None:
            out.append({"name": name, "shape": list(arr.shape), "datatype": dtype,
                        "data": arr.ravel().tolist()})
    return out


def _with(inputs: list[dict[str, Any]], name: str, **change: Any) -> list[dict[str, Any]]:
    out = copy.deepcopy(inputs)
    t = next(t for t in out if t["name"] == name)
    if "first" in change:
        t["data"][0] = change.pop("first")
    t.update(change)
    return out


async def test_v2_out_of_range_and_coerced_numbers_are_400_naming_the_input(
        client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    """Integers beyond the tensor's type (or any float) and booleans or strings in number
    data are refused with 400 naming the input, as the JSON route refuses them; no client
    number reaches a log line."""
    caplog.set_level(logging.DEBUG)
    base = _v2_tensors(client)
    ok = await client.post("/v2/models/mortality/infer", json={"inputs": base})
    assert ok.status_code == 200, ok.text
    cases = [
        ("lengths", {"first": 2**63}),
        ("lengths", {"first": 2**63 + 12345, "datatype": "INT32"}),
        ("lengths", {"first": 1.5}),
        ("lengths", {"first": True}),
        ("x", {"first": True}),
        ("x", {"first": "0.5"}),
        ("x", {"first": 10**400}),
        ("static", {"first": 10**400}),
    ]
    for name, change in cases:
        value = change["first"]
        body = json.dumps({"inputs": _with(base, name, **change)})
        r = await client.post("/v2/models/mortality/infer", content=body,
                              headers={"content-type": "application/json"})
        assert r.status_code == 400, (name, change, r.text)
        assert repr(name) in r.json()["error"], r.text
        if isinstance(value, int) and not isinstance(value, bool) and value > 2**31:
            assert str(value) not in caplog.text
            assert str(value) not in r.text
    # INT32 data beyond int32
    ints = _with(base, "lengths", datatype="INT32", first=2**40)
    r = await client.post("/v2/models/mortality/infer", json={"inputs": ints})
    assert r.status_code == 400 and "'lengths'" in r.json()["error"], r.text
    assert str(2**40) not in caplog.text


async def test_v2_unknown_version_does_not_name_the_served_one(
        client: httpx.AsyncClient) -> None:
    served = client.app.state.registry.get("mortality").model.spec.manifest.version  # type: ignore[attr-defined]
    for url in ("/v2/models/mortality/versions/9.9.9", "/v2/models/mortality/versions/9.9.9/ready",
                "/v2/models/mortality/versions/9.9.9/infer"):
        r = await (client.get(url) if not url.endswith("infer") else
                   client.post(url, json={"inputs": _v2_tensors(client)}))
        assert r.status_code == 404, (url, r.text)
        assert served not in r.text, (url, r.text)


async def test_closed_models_close_the_card_and_v2_metadata(
        make_settings: Callable[..., Settings]) -> None:
    """SCEHR_OPEN_MODELS=false closes every route that tells what is served (version,
    checksums, metrics), not only /models; scoring and probes stay."""
    async with serve(make_settings(open_models=False)) as c:
        for url in ("/models", "/models/mortality", "/models/mortality/card",
                    "/v2/models/mortality", "/v2/models/mortality/versions/1.0.0"):
            r = await c.get(url)
            assert r.status_code == 404, (url, r.status_code, r.text[:200])
        assert (await c.get("/v2/models/mortality/ready")).status_code == 200
        assert (await c.post("/predict/mortality", json=stay())).status_code == 200


# ------------------------------------------------------------------ FHIR before the parse


def _observations(b: dict[str, Any]) -> list[dict[str, Any]]:
    return [e["resource"] for e in b["entry"] if e["resource"]["resourceType"] == "Observation"
            and "valueQuantity" in e["resource"]]


async def _fhir(client: httpx.AsyncClient, body: bytes | dict[str, Any],
                content_type: str = "application/fhir+json") -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await client.post("/fhir/predict/mortality", content=data,
                             headers={"content-type": content_type})


def _rules(r: httpx.Response) -> list[str]:
    return [p["rule"] for p in r.json()["detail"]]


async def test_fhir_over_a_limit_is_refused_before_fhir_validation(
        make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch) -> None:
    """Millions of empty entries, too many Observations, extensions 300 deep: each a 422
    naming its rule, and FHIR validation never runs for them."""
    import scehr.service.interop.fhir_in as fhir_in

    calls: list[str] = []
    real = fhir_in.validate

    def spy(model: type, *a: Any, **kw: Any) -> Any:
        calls.append(model.__name__)
        return real(model, *a, **kw)

    monkeypatch.setattr(fhir_in, "validate", spy)
    async with serve(make_settings(max_observations=500)) as c:
        empty = (b'{"resourceType":"Bundle","type":"collection","entry":['
                 + b",".join([b"{}"] * 2_000_000) + b"]}")
        r = await _fhir(c, empty)
        assert r.status_code == 422 and _rules(r) == ["fhir_too_many_elements"], r.text[:300]

        many = example_bundle()
        obs = next(e for e in many["entry"] if e["resource"]["resourceType"] == "Observation")
        many["entry"] += [copy.deepcopy(obs) for _ in range(400)]
        r = await _fhir(c, many)
        assert r.status_code == 422 and _rules(r) == ["fhir_too_many_observations"], r.text

        deep = example_bundle()
        ext: dict[str, Any] = {"url": "http://example.org/x", "valueString": "leaf"}
        for _ in range(300):
            ext = {"url": "http://example.org/x", "extension": [ext]}
        deep["entry"][0]["resource"]["extension"] = [ext]
        r = await _fhir(c, deep)
        assert r.status_code == 422 and _rules(r) == ["fhir_too_deep"], r.text[:300]
        cds = example_cds_request()
        cds["prefetch"]["patient"]["extension"] = [ext]
        r = await c.post("/cds-services/scehr-mortality", json=cds)
        assert r.status_code == 422 and _rules(r) == ["fhir_too_deep"], r.text[:300]
        assert calls == [], calls
        ok = await _fhir(c, example_bundle())
        assert ok.status_code == 200, ok.text[:300]


async def test_fhir_inputs_that_used_to_500(client: httpx.AsyncClient) -> None:
    """A 309-digit value names its element; XML is 415; a string valueQuantity names the
    rule; a huge unmapped code is not echoed back whole."""
    b = example_bundle()
    _observations(b)[0]["valueQuantity"]["value"] = int("9" * 309)
    r = await _fhir(client, b)
    assert r.status_code == 422, r.text[:300]
    [p] = r.json()["detail"]
    assert "valueQuantity" in p["message"] and p["loc"][-1] == "value", p

    r = await _fhir(client, b"<Bundle xmlns='http://hl7.org/fhir'/>", "application/fhir+xml")
    assert r.status_code == 415 and "XML" in r.text, r.text
    r = await _fhir(client, b"<Bundle xmlns='http://hl7.org/fhir'/>", "application/xml")
    assert r.status_code == 415

    b = example_bundle()
    _observations(b)[0]["valueQuantity"] = "12 mmHg"
    r = await _fhir(client, b)
    assert r.status_code == 422, r.text[:300]
    assert "trailing" not in r.text and "valueQuantity" in r.text
    assert "Quantity" in r.json()["detail"][0]["message"].split(":", 1)[1], r.text

    b = example_bundle()
    _observations(b)[0]["code"]["coding"][0]["code"] = "7" * 2_000_000
    r = await _fhir(client, b)
    assert r.status_code == 200, r.text[:300]
    assert len(r.content) < 100_000


# ------------------------------------------------------------------ clients ignoring Retry-After


async def test_a_connection_back_before_its_retry_after_waits_for_it(
        make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused connection that comes back at once is refused again only when its
    Retry-After has come (a sleeping coroutine, not a loop of refusals); another connection,
    and an admitted request, are never held."""
    import scehr.service.load_shedding as load_shedding_module

    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def recording_sleep(seconds: float) -> None:
        if seconds:  # sleep(0) is a yield (the batcher's, before a lone run), not a hold
            waits.append(seconds)
        await real_sleep(0)

    app = create_app(make_settings(max_queue_size=2, retry_after_s=3))
    async with app.router.lifespan_context(app):
        def connection(port: int) -> httpx.AsyncClient:
            return httpx.AsyncClient(transport=httpx.ASGITransport(
                app=app, client=("10.0.0.1", port)), base_url="http://test")

        async with connection(1) as greedy, connection(2) as other:
            await wait_ready(greedy)
            monkeypatch.setattr(load_shedding_module.asyncio, "sleep", recording_sleep)
            app.state.load_shedder.admitted["mortality"] = 2  # full
            r = await greedy.post("/predict/mortality", json=stay())
            assert r.status_code == 503 and waits == []
            advice = int(r.headers["retry-after"])
            r = await greedy.post("/predict/mortality", json=stay())  # at once: held
            assert r.status_code == 503 and len(waits) == 1
            assert 0 < waits[0] <= advice
            r = await other.post("/predict/mortality", json=stay())  # another connection
            assert r.status_code == 503 and len(waits) == 1
            app.state.load_shedder.admitted["mortality"] = 0
            r = await greedy.post("/predict/mortality", json=stay())  # room: never held
            assert r.status_code == 200 and len(waits) == 1


# ------------------------------------------------------------------ liveness under heavy work


def test_serving_process_collects_young_objects_rarely(model_dir: Path) -> None:
    """Full collections walking a heavy request's millions of objects stalled the event loop
    60-160 ms each (benchmarks/bench_livez.py): the uvicorn factory raises the worker's young
    threshold and freezes its start-up objects (in a process of its own: never this one's);
    it also shortens the GIL switch interval to SCEHR_GIL_SWITCH_MS."""
    code = ("import gc, sys; from service.app import build_app; from service.gc_pauses import "
            "YOUNG_THRESHOLD as Y; build_app(); print(gc.get_threshold()[0] == Y, "
            "gc.get_freeze_count() > 0, abs(sys.getswitchinterval() - 0.002) < 1e-9)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCEHR_")}
    env["SCEHR_MODEL_DIR"] = str(model_dir)
    env["SCEHR_GIL_SWITCH_MS"] = "2"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-3:] == ["True"] * 3, r.stdout + r.stderr[-2000:]
