"""One scorer behind every interface: the same stay gets the same risk, warnings, audit line,
monitoring count, deadline answer and load-shedding answer through JSON (single and batch), FHIR,
CDS Hooks, Open Inference V2 (stays and tensors) and, for the risk and warnings, `scehr score`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from scehr.schemas.payloads import StayPayload
from scehr.service.interop.fhir_out import RISK_INTERVAL_URL
from scehr.service.offline_scoring import score_chunk
from scehr.service.pipeline import prepare
from tests.service.conftest import serve
from tests.service.test_svc_interop import TOL, cds_request, fhir_bundle, json_stay

pytestmark = pytest.mark.anyio
TASK = "mortality"


@dataclass
class Answer:
    """What an interface answered, read back into the JSON route's terms."""

    status: int
    headers: httpx.Headers
    risk: float | None = None
    warnings: set[str] | None = None  # warning codes, where the interface carries them
    error: str = ""  # the error code or message of a refusal
    interval: tuple[Any, ...] | None = None  # (low, high, level, outcomes), where carried


def _interval(ri: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """A JSON `risk_interval` as comparable values (None: the model serves none)."""
    return None if ri is None else (ri["low"], ri["high"], ri["level"], tuple(ri["outcomes"]))


async def _json(c: httpx.AsyncClient) -> Answer:
    r = await c.post(f"/predict/{TASK}", json=json_stay(), params={"explain": "basic"})
    if r.status_code != 200:
        return Answer(r.status_code, r.headers, error=r.json()["error"])
    p = r.json()
    return Answer(200, r.headers, p["results"][0]["risk"], {w["code"] for w in p["warnings"]},
                  interval=_interval(p["results"][0]["risk_interval"]))


async def _batch(c: httpx.AsyncClient) -> Answer:
    r = await c.post(f"/predict/{TASK}/batch", json={"stays": [json_stay()]})
    if r.status_code != 200:
        return Answer(r.status_code, r.headers, error=r.json()["error"])
    p = r.json()["items"][0]["prediction"]
    return Answer(200, r.headers, p["results"][0]["risk"], {w["code"] for w in p["warnings"]},
                  interval=_interval(p["results"][0]["risk_interval"]))


async def _fhir(c: httpx.AsyncClient) -> Answer:
    r = await c.post(f"/fhir/predict/{TASK}", json=fhir_bundle())
    if r.status_code != 200:
        return Answer(r.status_code, r.headers, error=r.json()["error"])
    res = [e["resource"] for e in r.json()["entry"]]
    [ra] = [x for x in res if x["resourceType"] == "RiskAssessment"]
    issues = [i for x in res if x["resourceType"] == "OperationOutcome" for i in x["issue"]]
    [ext] = ra["prediction"][0].get("extension") or [None]
    interval = None
    if ext is not None:
        assert ext["url"] == RISK_INTERVAL_URL
        parts = ext["extension"]
        [rng] = [e["valueRange"] for e in parts if e["url"] == "interval"]
        [level] = [e["valueDecimal"] for e in parts if e["url"] == "level"]
        interval = (rng["low"]["value"], rng["high"]["value"], level,
                    tuple(e["valueCode"] for e in parts if e["url"] == "outcome"))
    return Answer(200, r.headers, ra["prediction"][0]["probabilityDecimal"],
                  {i["details"]["text"] for i in issues if "details" in i}, interval=interval)


async def _cds(c: httpx.AsyncClient) -> Answer:
    r = await c.post(f"/cds-services/scehr-{TASK}", json=cds_request(fhir_bundle()))
    if r.status_code != 200:
        return Answer(r.status_code, r.headers, error=r.json()["error"])
    [card] = r.json()["cards"]
    result = card["extension"]["dev.scehr.result"]
    interval = _interval(result["risk_interval"])
    if interval is not None:  # the card says it, in its summary and in words
        assert f"[{interval[0]:.0%}-{interval[1]:.0%}" in card["summary"]
        assert f"between {interval[0]:.1%} and {interval[1]:.1%}" in card["detail"]
    return Answer(200, r.headers, result["risk"], interval=interval)


def _v2_answer(r: httpx.Response) -> Answer:
    if r.status_code != 200:
        body = r.json()
        return Answer(r.status_code, r.headers, error=body.get("error", ""))
    out = {o["name"]: o for o in r.json()["outputs"]}
    pred = json.loads(out["prediction"]["data"][0])
    return Answer(200, r.headers, out["risk"]["data"][0],
                  {w["code"] for w in pred["warnings"]})


async def _v2_stay(c: httpx.AsyncClient) -> Answer:
    return _v2_answer(await c.post(f"/v2/models/{TASK}/infer", json={"inputs": [
        {"name": "stay", "shape": [1], "datatype": "BYTES", "data": [json.dumps(json_stay())]}]}))


async def _v2_tensors(c: httpx.AsyncClient) -> Answer:
    spec = c.app.state.registry.get(TASK).model.spec  # type: ignore[attr-defined]
    inputs = prepare(spec, [StayPayload.model_validate(json_stay())]).inputs
    assert inputs is not None
    tensors = [{"name": "x", "shape": list(inputs.x.shape), "datatype": "FP32",
                "data": inputs.x.ravel().tolist()},
               {"name": "lengths", "shape": [1], "datatype": "INT64",
                "data": inputs.lengths.tolist()}]
    if inputs.static is not None:
        tensors.append({"name": "static", "shape": list(inputs.static.shape),
                        "datatype": "FP32", "data": inputs.static.ravel().tolist()})
    a = _v2_answer(await c.post(f"/v2/models/{TASK}/infer", json={"inputs": tensors}))
    a.warnings = None  # tensors carry no payload: nothing to warn about
    return a


INTERFACES: dict[str, Callable[[httpx.AsyncClient], Awaitable[Answer]]] = {
    "json": _json, "batch": _batch, "fhir": _fhir, "cds_hooks": _cds, "v2_stay": _v2_stay,
    "v2_tensors": _v2_tensors}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def server(model_dir: Any) -> AsyncIterator[httpx.AsyncClient]:
    from scehr.service.settings import Settings
    async with serve(Settings(model_dir=model_dir, device="cpu")) as c:
        yield c


@pytest.fixture(scope="module")
async def reference(server: httpx.AsyncClient) -> dict[str, Any]:
    r = await server.post(f"/predict/{TASK}", json=json_stay(), params={"explain": "basic"})
    assert r.status_code == 200, r.text
    p = r.json()
    return {"risk": p["results"][0]["risk"], "warnings": {w["code"] for w in p["warnings"]},
            "audit": p["audit"], "interval": _interval(p["results"][0]["risk_interval"])}


def _monitored(c: httpx.AsyncClient) -> int:
    app = c.app  # type: ignore[attr-defined]
    spec = app.state.registry.get(TASK).model.spec
    return app.state.monitoring.for_spec(spec).summary().stays


@pytest.mark.parametrize("interface", list(INTERFACES))
async def test_every_interface_scores_audits_and_monitors_alike(
        server: httpx.AsyncClient, reference: dict[str, Any], interface: str,
        caplog: pytest.LogCaptureFixture) -> None:
    before = _monitored(server)
    with caplog.at_level(logging.INFO, logger="scehr.audit"):
        a = await INTERFACES[interface](server)
    assert a.status == 200, a.error
    assert a.risk == pytest.approx(reference["risk"], abs=TOL)
    if interface in ("json", "batch", "fhir", "cds_hooks"):  # the interval rides with the risk
        assert reference["interval"] is not None and a.interval is not None
        assert a.interval[:3] == pytest.approx(reference["interval"][:3], abs=TOL)
        assert a.interval[3] == reference["interval"][3]
    if a.warnings is not None:
        assert reference["warnings"] and reference["warnings"] <= a.warnings
    [line] = [r for r in caplog.records if r.name == "scehr.audit"]
    ref = reference["audit"]
    assert (line.model_version, line.model_sha256, line.feature_set_hash,  # type: ignore
            line.operating_point) == (ref["model_version"], ref["model_sha256"],  # type: ignore
                                      ref["feature_set_hash"], ref["operating_point"])
    if interface != "v2_tensors":  # tensors are hashed as given (already normalized)
        assert line.input_sha256 == ref["input_sha256"]  # type: ignore[attr-defined]
    assert _monitored(server) == before + 1


@pytest.mark.parametrize("interface", list(INTERFACES))
async def test_every_interface_is_refused_by_load_shedding_when_full(
        server: httpx.AsyncClient, interface: str) -> None:
    app = server.app  # type: ignore[attr-defined]
    shedder = app.state.load_shedder
    shedder.admitted[TASK] = shedder.limit
    try:
        a = await INTERFACES[interface](server)
    finally:
        shedder.admitted[TASK] = 0
    assert a.status == 503 and "retry-after" in a.headers and a.error == "overloaded"


@pytest.mark.parametrize("interface", list(INTERFACES))
async def test_every_interface_answers_503_when_its_deadline_passes_in_the_queue(
        server: httpx.AsyncClient, interface: str) -> None:
    """The model is kept busy by another request; this one's queue wait outlives its
    deadline: 503 + Retry-After, whatever the interface."""
    app = server.app  # type: ignore[attr-defined]
    handle = app.state.registry.get(TASK)
    scorer = app.state.scorer
    batcher, run, settings = handle.batcher, handle.batcher._run, scorer.settings
    gate, entered = threading.Event(), threading.Event()

    def blocked(inputs: Any) -> Any:
        entered.set()
        gate.wait(10)
        return run(inputs)

    spec = handle.model.spec
    busy_inputs = prepare(spec, [StayPayload.model_validate(json_stay())]).inputs
    batcher._run = blocked
    scorer.settings = settings.model_copy(update={"request_timeout_s": 0.2})
    busy = asyncio.ensure_future(batcher.submit(busy_inputs))
    try:
        for _ in range(1000):  # until the busy run has started: nothing joins its batch
            if entered.is_set():
                break
            await asyncio.sleep(0.01)
        assert entered.is_set()
        a = await INTERFACES[interface](server)
    finally:
        gate.set()
        await busy
        batcher._run, scorer.settings = run, settings
    assert a.status == 503 and "retry-after" in a.headers, a.error
    assert any(w in a.error for w in ("deadline", "waited", "before reaching the model"))


@pytest.mark.parametrize("interface", list(INTERFACES))
async def test_every_interface_counts_decoding_and_preparation_in_its_deadline(
        server: httpx.AsyncClient, interface: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Preparation outlives the deadline: 503 + Retry-After, and the model never runs."""
    import scehr.service.scorer as scorer_module

    app = server.app  # type: ignore[attr-defined]
    handle = app.state.registry.get(TASK)
    scorer = app.state.scorer
    settings, run, runs = scorer.settings, handle.batcher._run, []

    def slow(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*a: Any, **kw: Any) -> Any:
            threading.Event().wait(0.3)
            return fn(*a, **kw)
        return wrapped

    monkeypatch.setattr(scorer_module, "prepare", slow(scorer_module.prepare))
    monkeypatch.setattr(scorer_module, "tensor_rows", slow(scorer_module.tensor_rows))
    handle.batcher._run = lambda inputs: runs.append(inputs) or run(inputs)
    scorer.settings = settings.model_copy(update={"request_timeout_s": 0.2})
    try:
        a = await INTERFACES[interface](server)
    finally:
        handle.batcher._run, scorer.settings = run, settings
    assert a.status == 503 and "retry-after" in a.headers, a.error
    assert any(w in a.error for w in ("deadline", "before reaching the model"))
    assert runs == []


def test_offline_scoring_gives_the_same_risk_and_warnings(model_dir: Any) -> None:
    """`scehr score` runs the scorer's offline path: the same risk and warnings as HTTP."""
    from scehr.service.registry import load_model
    from scehr.service.settings import Settings

    settings = Settings(model_dir=model_dir, device="cpu")
    model = load_model(model_dir / TASK / "v1", TASK, settings)
    [pred] = score_chunk(model, [json_stay()], model.max_batch_size,
                         settings.max_observations)

    async def http() -> dict[str, Any]:
        async with serve(settings) as c:
            r = await c.post(f"/predict/{TASK}", json=json_stay(), params={"explain": "basic"})
            return r.json()

    ref = asyncio.run(http())
    assert not isinstance(pred, list)
    assert pred.results[0].risk == pytest.approx(ref["results"][0]["risk"], abs=TOL)
    got = pred.results[0].risk_interval
    assert got is not None and _interval(got.model_dump()) == _interval(
        ref["results"][0]["risk_interval"])
    assert {w.code for w in pred.warnings} == {w["code"] for w in ref["warnings"]}
    assert pred.audit.input_sha256 == ref["audit"]["input_sha256"]
