"""Bounded load and fault tests (loopback only, every loop bounded): overload, soak, SIGTERM
under load, a corrupt model at reload. The long versions are benchmarks/bench_overload.py,
bench_soak.py and bench_livez.py (docs/reliability.md)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from scehr.schemas.manifest import sha256_file
from scehr.service.settings import Settings
from tests.service.conftest import serve, stay, wait_until_serving
from tests.service.fixture_model import write_model, write_model_dir
from tests.service.test_svc_process import REPO, free_port, scehr_command

pytestmark = pytest.mark.anyio
KEY = {"X-API-Key": "s3cret"}


async def test_overload_fast_503s_no_other_5xx_and_bounded_queue(
        make_settings: Callable[..., Settings]) -> None:
    """400 concurrent requests on a model held shut, bound 16: every refusal is answered while
    the model still computes nothing (a refusal never waits for it); then all admitted are 200."""
    async with serve(make_settings(max_queue_size=16, max_batch_size=4,
                                   request_timeout_s=60)) as c:
        app = c.app  # type: ignore[attr-defined]
        batcher = app.state.registry.handles["mortality"].batcher
        run, peak, gate = batcher._run, {"queued": 0}, threading.Event()

        def held(inputs: Any) -> Any:
            peak["queued"] = max(peak["queued"], batcher.queued)
            if threading.current_thread() is not threading.main_thread():
                gate.wait(60)  # only worker threads wait: the event loop must stay free
            return run(inputs)
        batcher._run = held
        body = json.dumps(stay()).encode()

        async def one() -> tuple[int, str | None]:
            r = await c.post("/predict/mortality", content=body,
                             headers={"content-type": "application/json"})
            return r.status_code, r.headers.get("retry-after")

        shedder = app.state.load_shedder
        tasks = [asyncio.create_task(one()) for _ in range(400)]
        for _ in range(6000):  # until every request not admitted has been answered
            await asyncio.sleep(0.01)
            if sum(t.done() for t in tasks) + shedder.admitted["mortality"] == len(tasks):
                break
        refused = [t.result() for t in tasks if t.done()]
        assert refused and {s for s, _ in refused} == {503}, Counter(s for s, _ in refused)
        assert all(ra is not None and int(ra) >= 1 for _, ra in refused)
        gate.set()
        results = await asyncio.gather(*tasks)
        batcher._run = run
        statuses = Counter(s for s, _ in results)
        assert set(statuses) <= {200, 503}, statuses
        assert statuses[200] == len(tasks) - len(refused) and statuses[200] >= 4, statuses
        assert shedder.peak["mortality"] <= 16 and peak["queued"] <= 16
        assert shedder.admitted["mortality"] == 0
        assert (await c.post("/predict/mortality", json=stay())).status_code == 200


async def test_bounded_soak_no_errors_bounded_metrics(make_settings: Callable[..., Settings],
                                                      ) -> None:
    """3,000 mixed requests (valid, invalid, unknown tasks and routes, scrapes)."""
    mix: list[tuple[str, str, Any, int]] = [
        ("POST", "/predict/mortality", stay(), 200),
        ("POST", "/predict/phenotypes", stay(end_hours=48.0), 200),
        ("POST", "/predict/mortality/batch", {"stays": [stay(), {"wide": 1}, 42]}, 200),
        ("POST", "/predict/mortality", {"observations": [{"variable": "x"}]}, 422),
        ("POST", "/predict/nope{i}/batch", {"stays": [stay()]}, 404),
        ("GET", "/random/{i}", None, 404),
        ("GET", "/metrics", None, 200),
    ]
    async with serve(make_settings()) as c:
        bad: Counter[str] = Counter()
        sizes = []
        for i in range(3000):
            method, url, body, want = mix[i % len(mix)]
            r = await c.request(method, url.format(i=i), json=body)
            if r.status_code != want:
                bad[f"{url} {r.status_code}"] += 1
            if url == "/metrics" and i > len(mix) * 2:
                sizes.append(len(r.content))
        assert not bad, bad
        assert max(sizes) - min(sizes) < 2000, (min(sizes), max(sizes))  # counts grow, not series


@pytest.mark.slow
def test_sigterm_under_load_loses_no_request(model_dir: Path, tmp_path: Path) -> None:
    """Requests in flight (held in the batcher), then SIGTERM: every accepted one is answered
    200; any sent after the signal is refused at connect (never accepted, so never lost)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCEHR_")}
    # The batcher holds a batch up to 10 s: far longer than the 40 requests take to arrive on
    # any machine, so they are all in flight when the signal comes.
    env.update(SCEHR_MAX_QUEUE_DELAY_MS="10000", SCEHR_MAX_BATCH_SIZE="64",
               SCEHR_REQUEST_TIMEOUT_S="30",
               SCEHR_LOG_LEVEL="WARNING")
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([*scehr_command(), "serve", "--port", str(port), "--model-dir",
                                 str(model_dir), "--device", "cpu", "--workers", "1"],
                                cwd=REPO, env=env, stdout=out, stderr=out)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(proc, base, log.read_text)
        results: list[int | str] = []

        clients = [httpx.Client(base_url=base, timeout=30) for _ in range(40)]  # made up front

        def send(i: int) -> None:
            try:
                r = clients[i].post("/predict/mortality", json=stay(hr=80 + i),
                                    params={"explain": "basic"})  # one row each: they wait
                results.append(r.status_code)
            except httpx.HTTPError as e:
                results.append(repr(e))

        threads = [threading.Thread(target=send, args=(i,)) for i in range(40)]
        for t in threads:
            t.start()
        in_flight, t0 = 0, time.monotonic()
        with httpx.Client(base_url=base, timeout=5) as scraper:
            while time.monotonic() - t0 < 6:  # well inside the batcher's 10 s hold
                text = scraper.get("/metrics").text
                line = next(x for x in text.splitlines() if x.startswith("scehr_in_flight"))
                in_flight = int(float(line.split()[-1])) - 1  # less this scrape
                if in_flight >= len(threads):
                    break
                time.sleep(0.02)
        assert not results and in_flight >= 10, (results, in_flight)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(30)
        for client in clients:
            client.close()
        counts = Counter(results)
        assert counts[200] >= in_flight, counts
        assert all(r == 200 or "ConnectError" in str(r) for r in results), counts
        assert proc.wait(30) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()


async def test_corrupt_model_at_reload_keeps_the_old_one(tmp_path: Path) -> None:
    write_model_dir(tmp_path)
    bad = write_model(tmp_path, "mortality", "bad", seed=5)
    (bad / "model.onnx").write_bytes(b"\x08\x07garbage" * 100)
    m = json.loads((bad / "manifest.json").read_text())
    m["onnx"]["sha256"] = sha256_file(bad / "model.onnx")
    (bad / "manifest.json").write_text(json.dumps(m))
    async with serve(Settings(model_dir=tmp_path, device="cpu", api_keys="s3cret")) as c:
        sent = [c.post("/predict/mortality", json=stay(), headers=KEY) for _ in range(20)]
        reload = c.post("/admin/models/mortality/reload", json={"path": "mortality/bad"},
                        headers=KEY)
        *answers, r = await asyncio.gather(*sent, reload)
        assert r.status_code == 422 and r.json()["detail"][0]["rule"] == "onnx_invalid"
        assert all(a.status_code == 200 for a in answers)
        after = await c.post("/predict/mortality", json=stay(), headers=KEY)
        assert after.json()["model"]["version"] == "v1"

