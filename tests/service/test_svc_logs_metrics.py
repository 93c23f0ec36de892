"""JSON logs with request ids and no patient values; metric names and labels."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from scehr.service.logs import JsonFormatter, configure_logging
from scehr.service.settings import Settings
from tests.service.conftest import serve

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]

SECRETS = ["123.4567", "38.7654", "87.65", "MRN-77-SECRET", "9.8765", "250.125", "66.6061",
           "Winks-Secret"]


def secret_stay() -> dict:
    return {
        "id": "MRN-77-SECRET",
        "observations": [
            {"variable": "heart_rate", "time": 1.0, "value": 123.4567},
            {"variable": "temperature", "time": 2.0, "value": 38.7654, "unit": "Cel"},
            {"variable": "glucose", "time": 3.0, "value": 9.8765, "unit": "mmol/L"},
            {"variable": "heart_rate", "time": 4.0, "value": 666.6061},  # dropped
        ],
        "demographics": {"age": 87.65, "sex": "male"},
    }


async def test_no_patient_values_in_logs_at_debug(
        make_settings: Callable[..., Settings]) -> None:
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(JsonFormatter())
    handler.setLevel(logging.DEBUG)
    loggers = [logging.getLogger(), logging.getLogger("scehr")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    try:
        async with serve(make_settings(log_level="DEBUG", api_keys="k")) as c:
            h = {"X-API-Key": "k"}
            for explain in ("basic", "full"):
                r = await c.post("/predict/mortality", json=secret_stay(),
                                 params={"explain": explain}, headers=h)
                assert r.status_code == 200
            bad = {**secret_stay(), "demographics": {"age": 250.125}}
            assert (await c.post("/predict/mortality", json=bad, headers=h)).status_code == 422
            wrong = {"observations": [{"variable": "gcs_eye", "time": 1, "value": "Winks-Secret"}]}
            assert (await c.post("/predict/mortality", json=wrong, headers=h)).status_code == 422
            r = await c.post("/predict/phenotypes/batch", headers=h,
                             json={"stays": [secret_stay(), wrong, bad]})
            assert r.status_code == 200
            await c.post("/predict/mortality", json=secret_stay(), headers={"X-API-Key": "no"})
    finally:
        for lg, lvl in zip(loggers, levels, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(lvl)
    text = buf.getvalue()
    assert '"logger": "scehr.access"' in text and '"status": 422' in text  # logs were captured
    for s in SECRETS:
        assert s not in text, s


async def test_request_id_echoed_or_generated(client) -> None:
    r = await client.get("/livez", headers={"x-request-id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    r = await client.get("/livez")
    assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"])
    r = await client.get("/livez", headers={"x-request-id": "bad id\twith spaces" * 10})
    assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_generated_request_ids_differ_in_a_forked_worker() -> None:
    """Generated ids come from a per-process generator: a forked worker reseeds it, so two
    workers never generate the same sequence of ids."""
    from scehr.service.middleware import new_request_id

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, then out at once
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    os.close(write)
    ids = {new_request_id() for _ in range(1000)}
    assert re.fullmatch(r"[0-9a-f]{32}", child) and child not in ids and len(ids) == 1000


def test_json_formatter_one_object_per_line() -> None:
    rec = logging.LogRecord("scehr.x", logging.INFO, __file__, 1, "hello %s", ("w",), None)
    rec.task = "mortality"
    out = json.loads(JsonFormatter().format(rec))
    assert out["msg"] == "hello w" and out["task"] == "mortality" and out["level"] == "INFO"


def test_json_formatter_time_of_every_record() -> None:
    """One formatter, records across second (and day) boundaries, out of order: each line's
    `ts` is its own record's UTC time to the millisecond."""
    formatter = JsonFormatter()
    for created in (1796491255.4833, 1796491255.999, 1796491256.0004, 1796447999.9991,
                    1796491255.002, 86399.5, 86400.25):
        rec = logging.LogRecord("scehr.x", logging.INFO, __file__, 1, "m", (), None)
        rec.created, rec.msecs = created, int((created - int(created)) * 1000) + 0.0
        want = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + \
            f".{int(rec.msecs):03d}Z"
        assert json.loads(formatter.format(rec))["ts"] == want


def test_python_warnings_reach_the_log_stream_as_json() -> None:
    """A numpy RuntimeWarning raised while serving is a JSON log line, not plain text."""
    code = ("from service.logs import configure_logging; configure_logging('INFO'); "
            "import numpy as np; np.log(np.zeros(1))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert lines, "the warning was not emitted at all"
    records = [json.loads(ln) for ln in lines]  # fails on a plain-text warning line
    assert any(r["logger"] == "py.warnings" and "RuntimeWarning" in r["msg"] for r in records)


async def test_metric_names_and_labels(client) -> None:
    scored = (await client.post("/predict/mortality", json=secret_stay())).json()
    unobserved = sum(w["code"] == "channel_not_observed" for w in scored["warnings"])
    assert unobserved > 1  # several notices of one code: each one counted
    await client.post("/predict/mortality", json={"observations": [
        {"variable": "pulse", "time": 1, "value": 1}]})
    await client.post("/predict/mortality", json={"observations": "x"})
    text = (await client.get("/metrics")).text
    for line in (
        'scehr_requests_total{endpoint="/predict/mortality",model="mortality",status="200"} 1.0',
        'scehr_requests_total{endpoint="/predict/mortality",model="mortality",status="422"} 2.0',
        'scehr_validation_errors_total{model="mortality",rule="unknown_variable"} 1.0',
        'scehr_validation_errors_total{model="mortality",rule="list_type"} 1.0',
        'scehr_warnings_total{code="value_dropped",model="mortality"} 1.0',
        f'scehr_warnings_total{{code="channel_not_observed",model="mortality"}} {unobserved}.0',
        'scehr_model_info{name="fixture-mortality-cbce",provider="CPUExecutionProvider",'
        'task="mortality",version="v1"} 1.0',
        "scehr_in_flight_requests 1.0",  # the /metrics request itself
    ):
        assert line in text, line
    for name in ("scehr_request_duration_seconds_bucket", "scehr_queue_seconds_bucket",
                 "scehr_compute_seconds_bucket", "scehr_batch_size_bucket",
                 "scehr_preprocess_seconds_bucket"):
        assert re.search(rf'{name}{{.*model="mortality"', text), name
    assert "_created" not in text


async def test_answers_before_routing_are_counted_under_their_route(
        make_settings: Callable[..., Settings]) -> None:
    """401 (no key), 415 (media type) and the overload 503 come before the router: still
    counted under the route's template, so a dashboard per route sees them; unknown paths
    stay `unmatched`."""
    async with serve(make_settings(api_keys="k", max_queue_size=2)) as c:
        key = {"X-API-Key": "k"}
        assert (await c.post("/predict/mortality", json={})).status_code == 401
        r = await c.post("/fhir/predict/mortality", content=b"{}",
                         headers={**key, "content-type": "text/plain"})
        assert r.status_code == 415
        c.app.state.load_shedder.admitted["mortality"] = 2  # type: ignore[attr-defined]
        r = await c.post("/predict/mortality/batch", json={"stays": []}, headers=key)
        assert r.status_code == 503
        assert (await c.post("/no/such/path", json={})).status_code == 404
        text = (await c.get("/metrics")).text
    for line in (
        'scehr_requests_total{endpoint="/predict/mortality",model="unknown",status="401"} 1.0',
        'scehr_requests_total{endpoint="/fhir/predict/{task}",model="mortality",status="415"}',
        'scehr_requests_total{endpoint="/predict/{task}/batch",model="mortality",status="503"}',
        'scehr_requests_total{endpoint="unmatched",model="unknown",status="404"} 1.0',
    ):
        assert line in text, line


@pytest.mark.parametrize(("raised", "status"), [(None, 499), ("disconnect", 499),
                                                 ("bug", 500)])
async def test_a_client_that_left_is_499_but_a_failure_after_it_is_still_500(
        raised: str | None, status: int) -> None:
    """The app reads the body and is told the client left: whether it then answers into the
    closed connection or raises starlette's ClientDisconnect, the request is 499 with
    `client_closed`, no error logged; any other exception is the server's own 500."""
    from starlette.requests import ClientDisconnect

    from scehr.service.metrics import Metrics
    from scehr.service.middleware import RequestContextMiddleware

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        assert (await receive())["type"] == "http.disconnect"
        if raised == "disconnect":
            raise ClientDisconnect
        if raised == "bug":
            raise RuntimeError("a bug")
        await send({"type": "http.response.start", "status": 400, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        pass

    configure_logging("INFO")  # as the app does
    metrics = Metrics()
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("scehr").addHandler(handler)
    try:
        await RequestContextMiddleware(app, metrics)(
            {"type": "http", "method": "POST", "path": "/x", "headers": []}, receive, send)
    finally:
        logging.getLogger("scehr").removeHandler(handler)
    [line] = [r for r in records if r.getMessage() == "request"]
    assert line.status == status  # type: ignore[attr-defined]
    assert getattr(line, "client_closed", False) is (status == 499)
    assert any(r.levelno >= logging.ERROR for r in records) is (status == 500)
    text = metrics.render()[0].decode()
    assert f'endpoint="unmatched",model="unknown",status="{status}"}} 1.0' in text


def test_multiprocess_metrics(tmp_path: Path, model_dir: Path) -> None:
    """With PROMETHEUS_MULTIPROC_DIR set, /metrics aggregates the files (own process here)."""
    script = f"""
import asyncio, sys
sys.path.insert(0, {str(REPO)!r})
from tests.service.conftest import serve, stay
from scehr.service.settings import Settings
async def main():
    async with serve(Settings(model_dir={str(model_dir)!r}, device="cpu", tasks="mortality")) as c:
        assert (await c.post("/predict/mortality", json=stay())).status_code == 200
        print((await c.get("/metrics")).text)
asyncio.run(main())
"""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert 'scehr_requests_total{endpoint="/predict/mortality",model="mortality",status="200"}' \
        in out
    assert re.search(r'scehr_model_info{.*pid="\d+".*} 1.0', out)
    assert list(tmp_path.glob("*.db"))
