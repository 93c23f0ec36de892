"""The CPU of a stay's risk at every hour against one risk: `POST /predict/mortality/trajectory`
(the default landmark model, hours 1..48) against `POST /predict/mortality` (the default
48-hour model, the default request: explain=basic), both on the example stay.

    .venv/bin/python benchmarks/trajectory_cost.py [--requests 300] [--passes 3]
    BENCH_MODEL_DIR=<models folder> .venv/bin/python benchmarks/trajectory_cost.py
    .venv/bin/python benchmarks/trajectory_cost.py --fixture   # a smoke run, no real models

The app runs in this process behind `httpx.ASGITransport` (no sockets), with its lifespan and
middleware, ORT at one intra-op thread. The two routes alternate per request (which goes first
alternates too), so a busy neighbour slows both alike. Per request: the CPU time of the whole
process (every thread: the event loop's, worker threads, ORT's) and of the event loop's
thread alone. Prints the medians, their ratio (the target: a trajectory <= 2x one risk) and
the load average before and after; figures are printed, never asserted. The model folder must
serve both tasks (`--fixture`: the tests' fixture models, whose graphs are not the real ones:
a check that the script runs, not a figure).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from common import REPO, real_models

STAY = REPO / "examples" / "mortality_stay.json"
ROUTES = {"one risk": "/predict/mortality", "trajectory": "/predict/mortality/trajectory"}


def fixture_models() -> Path:
    """The tests' fixture models on the example stay's feature set: mortality (an ONNX LSTM of
    16 units) and mortality-landmark (a cumulative mean: far cheaper than a real encoder)."""
    from scehr.schemas.featureset import FEATURE_SETS
    from tests.service.fixture_model import write_index, write_model

    root = Path(tempfile.mkdtemp(prefix="scehr-trajectory-cost-"))
    fs = FEATURE_SETS["physionet2012-full"]  # the example stay's variables
    write_model(root, "mortality", "v1", seed=1, lstm_hidden=16, uncertainty=True,
                feature_set=fs)
    write_model(root, "mortality-landmark", "v1", seed=7, feature_set=fs)
    write_index(root, [("mortality", "v1"), ("mortality-landmark", "v1")])
    return root


def app_of(models: Path) -> Any:
    from scehr.service.app import create_app
    from scehr.service.settings import Settings

    return create_app(Settings(model_dir=models, device="cpu", intra_op_threads=1,
                               log_level="WARNING", tasks=["mortality", "mortality-landmark"]))


async def run(app: Any, body: bytes, requests: int, passes: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {f"{n} {k}": [] for n in ROUTES for k in ("process", "loop")}
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cost")
    async with app.router.lifespan_context(app), client as c:
        while (await c.get("/readyz")).status_code != 200:
            await asyncio.sleep(0.1)
        headers = {"content-type": "application/json"}
        for url in ROUTES.values():  # warm-up
            for _ in range(20):
                r = await c.post(url, content=body, headers=headers)
                assert r.status_code == 200, r.text[:300]
        print(f"hours per trajectory: {len(json.loads(r.content)['hours'])}")
        gc.collect()
        names = list(ROUTES)
        for p in range(passes):
            for i in range(requests):
                for name in (names if (i + p) % 2 else names[::-1]):
                    p0, t0 = time.process_time(), time.thread_time()
                    r = await c.post(ROUTES[name], content=body, headers=headers)
                    t1, p1 = time.thread_time(), time.process_time()
                    assert r.status_code == 200, r.text[:300]
                    times[f"{name} process"].append(p1 - p0)
                    times[f"{name} loop"].append(t1 - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300, help="requests per route and pass")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--fixture", action="store_true",
                    help="the tests' fixture models (a smoke run: not a figure to report)")
    args = ap.parse_args()
    models = fixture_models() if args.fixture else real_models()
    body = STAY.read_bytes()
    load_before = os.getloadavg()
    times = asyncio.run(run(app_of(models), body, args.requests, args.passes))
    print(f"{args.passes} passes of {args.requests} requests per route, alternated per request, "
          f"models: {'fixture (not a figure)' if args.fixture else models}; load average "
          f"{load_before} before, {os.getloadavg()} after")
    print("| CPU | one risk ms | trajectory ms | trajectory / one risk |")
    print("|---|---|---|---|")
    for kind in ("process", "loop"):
        one = np.median(times[f"one risk {kind}"]) * 1e3
        traj = np.median(times[f"trajectory {kind}"]) * 1e3
        print(f"| {kind} | {one:.3f} | {traj:.3f} | {traj / one:.2f} |")


if __name__ == "__main__":
    main()
