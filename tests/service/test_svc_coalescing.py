"""Concurrent HTTP requests are coalesced into shared ORT runs with identical results."""

from __future__ import annotations

import asyncio
import json
import math
import re
import threading
import time
from collections.abc import Callable

import pytest

from scehr.service.settings import Settings
from tests.service.conftest import serve, stay

pytestmark = pytest.mark.anyio


def batch_runs(metrics: str, task: str) -> tuple[float, float]:
    """(number of ORT runs, rows) from the batch-size histogram."""
    count = re.search(rf'scehr_batch_size_count{{model="{task}"}} (\S+)', metrics)
    total = re.search(rf'scehr_batch_size_sum{{model="{task}"}} (\S+)', metrics)
    if count is None or total is None:  # no run yet (warm-up runs are not counted)
        return 0.0, 0.0
    return float(count.group(1)), float(total.group(1))


@pytest.mark.parametrize("task", ["mortality", "phenotypes"])
async def test_batched_equals_unbatched(make_settings: Callable[..., Settings],
                                        task: str) -> None:
    stays = [stay(hr=60 + 7 * k, hours=(1.0, 3.0 + 11 * k)) for k in range(12)]
    results = {}
    for size in (1, 32):
        async with serve(make_settings(max_batch_size=size, max_queue_delay_ms=20)) as c:
            before = batch_runs((await c.get("/metrics")).text, task)
            rs = await asyncio.gather(*(c.post(f"/predict/{task}", json=s,
                                               params={"explain": "basic"}) for s in stays))
            after = batch_runs((await c.get("/metrics")).text, task)
        assert all(r.status_code == 200 for r in rs)
        runs, rows = after[0] - before[0], after[1] - before[1]
        assert rows == len(stays)
        assert (runs == len(stays)) if size == 1 else (runs < len(stays)), (size, runs)
        results[size] = [r.json() for r in rs]
    assert_same(results[1], results[32])


def assert_same(a: object, b: object, path: str = "") -> None:
    """Element-wise: equal structure, strings, flags and ints; floats to float32 rounding.

    ONNX Runtime's CPU GEMM blocks a 1-row and an n-row matmul differently, so the graph's
    float32 outputs can differ in the last bits (~1e-7 relative; ~1e-6 on a margin u - v).
    """
    if isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5), (path, a, b)  # type: ignore
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, (path, a, b)


async def test_overload_is_503_with_retry_after(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(max_batch_size=1, max_queue_size=1, max_queue_delay_ms=0,
                             retry_after_s=3)
    async with serve(settings) as c:
        model = c.app.state.registry.handles["mortality"].model  # type: ignore[attr-defined]
        real = model.run

        def slow(inputs):
            time.sleep(0.2)
            return real(inputs)

        model.run = slow
        handle = c.app.state.registry.handles["mortality"]  # type: ignore[attr-defined]
        handle.batcher._run = slow
        rs = await asyncio.gather(*(c.post("/predict/mortality", json=stay()) for _ in range(6)))
        codes = sorted(r.status_code for r in rs)
        assert 200 in codes and 503 in codes, codes
        busy = next(r for r in rs if r.status_code == 503)
        assert busy.headers["retry-after"] == "3" and busy.json()["error"] == "overloaded"
        metrics = (await c.get("/metrics")).text
    assert re.search(r'scehr_overload_rejections_total{model="mortality"} [1-9]', metrics)


@pytest.mark.parametrize(("offload_bytes", "on_loop"), [(32 * 1024, True), (0, False)])
async def test_a_lone_explain_top_request_runs_its_occlusion_rows_on_the_loop_unless_heavy(
        make_settings: Callable[..., Settings], offload_bytes: int, on_loop: bool) -> None:
    """A lone single-stay request at the default explain=top (the stay and its occlusion rows,
    one run) skips the hand-off to the ORT thread; a heavy one (a body over
    SCEHR_OFFLOAD_BYTES) keeps all of its work off the event loop."""
    threads: list[tuple[int, int]] = []
    async with serve(make_settings(offload_bytes=offload_bytes)) as c:
        batcher = c.app.state.registry.get("mortality").batcher  # type: ignore[attr-defined]
        run = batcher._run

        def recorded(inputs):  # type: ignore[no-untyped-def]
            threads.append((threading.get_ident(), inputs.rows))
            return run(inputs)

        batcher._run = recorded
        r = await c.post("/predict/mortality?explain=top", json=stay())
    assert r.status_code == 200 and r.json()["results"][0]["contributions"]
    [(thread, rows)] = threads
    assert rows > 1  # the stay and its occlusion rows, in one run
    assert (thread == threading.get_ident()) is on_loop


async def test_a_lone_long_stay_is_light_by_default(make_settings: Callable[..., Settings]
                                                    ) -> None:
    """A single stay of 32-64 kB of JSON (a long ICU stay; a sixth of PhysioNet set C as
    LOINC-coded long form) is light under the default SCEHR_OFFLOAD_BYTES: decoding it holds the
    loop about a millisecond, less than the hand-offs to a worker thread and back cost under
    load, so a lone one runs its ORT row on the event loop's thread like a small stay."""
    body = stay(hours=tuple(0.3 * k for k in range(160)))
    assert 32 * 1024 < len(json.dumps(body)) < 64 * 1024
    threads: list[int] = []
    async with serve(make_settings()) as c:
        batcher = c.app.state.registry.get("mortality").batcher  # type: ignore[attr-defined]
        run = batcher._run

        def recorded(inputs):  # type: ignore[no-untyped-def]
            threads.append(threading.get_ident())
            return run(inputs)

        batcher._run = recorded
        r = await c.post("/predict/mortality?explain=basic", json=body)
    assert r.status_code == 200, r.text[:300]
    assert threads == [threading.get_ident()]
