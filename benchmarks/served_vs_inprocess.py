"""What serving adds to a request, against the request's own work, for the same real stays.

    .venv/bin/python benchmarks/served_vs_inprocess.py [--task mortality] [--stays 200]
        [--passes 3]

For each of `explain=basic` (every route's default) and `explain=top`:

- **in-process work**: the route's own steps called directly on this thread, per stay:
  parse + validate the bytes (`parse_stay`), ingest + tensorize (`prepare`, with the occlusion
  rows at `top`), the ORT run (the served model's session settings for one worker), the
  read-outs and explanation (`predictions`) and the response JSON;
- **served p50**: `scehr serve --workers 1`, one keep-alive connection, the same bodies one
  after another;
- **HTTP floor**: the same bodies POSTed on one keep-alive connection to a bare uvicorn app
  (uvicorn's defaults, as `scehr serve` runs it) whose one async route reads the body and
  answers an empty 200: what any Python ASGI server costs for that request.

The figure of merit is (served p50 - floor) / in-process p50 (target <= 1.5): how much the
service adds beyond the work itself (routing, middleware, admission, batcher, metrics,
monitoring, logs). Medians over stays, best of `--passes` passes. Each pass times the three
one after another (the in-process work between the served requests and the floor's, the same
bodies as often as they are sent), so a burst of load from another job touches all three
alike; and the in-process work runs under the worker's garbage-collector settings
(`scehr.service.gc_pauses.tune_collector`), not the interpreter's defaults, which collect the young
generation every 700 allocations where a served worker does every 100,000. The same ratio is
printed in CPU time too (the server processes' CPU per request from /proc, the in-process work's
`time.process_time`, which counts ORT's threads): a shared machine inflates CPU time far less
than wall time. The load average is printed before and after, as ratios taken under load are
not ratios of the code. Only prints.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from common import (
    Conn,
    dumps,
    free_port,
    loadavg,
    model_dir,
    post,
    server,
    tree_cpu_seconds,
    wait_until_healthy,
)
from payloads import default_model_stays

from scehr.service.explain import LEVELS
from scehr.service.gc_pauses import tune_collector
from scehr.service.interfaces.json_single import parse_stay
from scehr.service.pipeline import prepare
from scehr.service.registry import LoadedModel, load_model, read_index, resolve
from scehr.service.responses import predictions
from scehr.service.settings import Settings

EXPLAINS = ("top", "basic")
#: Times the bodies are sent per timed block (see `timed`).
CPU_ROUNDS = 3

#: The floor server: uvicorn's defaults (as `scehr serve`), one async route reading the body.
_FLOOR_APP = """import sys, uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

async def noop(request):
    await request.body()
    return Response(b"", media_type="application/json")

app = Starlette(routes=[Route("/noop", noop, methods=["GET", "POST"])])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            access_log=False)
"""


@contextmanager
def floor_server() -> Iterator[tuple[int, int]]:
    """(port, pid) of the bare uvicorn app."""
    port = free_port()
    with tempfile.NamedTemporaryFile(prefix="scehr-floor-", suffix=".log", delete=False) as log:
        proc = subprocess.Popen([sys.executable, "-c", _FLOOR_APP, str(port)], stdout=log,
                                stderr=log)
        try:
            wait_until_healthy(proc, port, "/noop", log.name, timeout_s=60, poll_s=0.1,
                               what="floor server")
            yield port, proc.pid
        finally:
            proc.terminate()
            proc.wait(30)


def in_process_ms(m: LoadedModel, bodies: list[bytes], explain: str
                  ) -> tuple[list[float], float]:
    """Per body, wall ms of the route's steps called directly (no HTTP, no service layers);
    and the CPU ms per body (this process, ORT's threads included). The first 20 bodies go
    once untimed first, as the served requests' warm-up does."""

    def work(b: bytes) -> None:
        stay = parse_stay(b)
        prep = prepare(m.spec, [stay], occlusion=LEVELS[explain].occlusion)
        assert prep.inputs is not None, "a benchmark stay was refused"
        res = m.run(prep.inputs)
        predictions(m.spec, prep, res, explain=explain)[0].model_dump_json()

    for b in bodies[:20]:
        work(b)
    out = []
    cpu0 = time.process_time()
    for b in bodies:
        t0 = time.perf_counter()
        work(b)
        out.append((time.perf_counter() - t0) * 1e3)
    return out, (time.process_time() - cpu0) / len(bodies) * 1e3


async def served_ms(port: int, path: str, bodies: list[bytes]) -> list[float]:
    conn = await Conn.open(port)
    try:
        for b in bodies[:20]:  # warm-up
            await conn.send(post(path, b))
        lat = []
        for b in bodies:
            t0 = time.perf_counter()
            status, body = await conn.send(post(path, b))
            lat.append((time.perf_counter() - t0) * 1e3)
            if status != 200:
                raise RuntimeError(f"{path}: status {status}: {body[:300]!r}")
        return lat
    finally:
        conn.close()


def best_median(runs: list[list[float]]) -> float:
    return min(float(np.median(r)) for r in runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="mortality")
    ap.add_argument("--stays", type=int, default=200)
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args()
    load_before = loadavg()
    models, which = model_dir()
    stays, what = default_model_stays(args.task, args.stays, models)
    bodies = [dumps(s) for s in stays]
    del stays
    path = f"/predict/{args.task}"
    served: dict[str, list[list[float]]] = {e: [] for e in EXPLAINS}
    served_cpu: dict[str, list[float]] = {e: [] for e in EXPLAINS}
    floor: list[list[float]] = []
    floor_cpu: list[float] = []

    def timed(port: int, pid: int, route: str) -> tuple[list[float], float]:
        # /proc counts CPU in clock ticks (10 ms): the bodies go CPU_ROUNDS times, so that
        # a tick is a small share of the CPU per request.
        c0 = tree_cpu_seconds(pid)
        lat = asyncio.run(served_ms(port, route, bodies * CPU_ROUNDS))
        return lat, (tree_cpu_seconds(pid) - c0) / (len(bodies) * CPU_ROUNDS + 20) * 1e3

    # The served model's session as `scehr serve --workers 1` builds it (ORT threads included).
    m = load_model(resolve(models, read_index(models), args.task), args.task,
                   Settings(model_dir=models, device="cpu", workers=1))
    tune_collector()  # as the served worker does once its app is built
    work: dict[str, list[list[float]]] = {e: [] for e in EXPLAINS}
    work_cpu: dict[str, list[float]] = {e: [] for e in EXPLAINS}
    with server(models, workers=1) as srv, floor_server() as (floor_port, floor_pid):
        for _ in range(args.passes):  # interleaved, so that a burst of load hits all alike
            for e in EXPLAINS:
                lat, cpu = timed(srv.port, srv.pid, f"{path}?explain={e}")
                served[e].append(lat)
                served_cpu[e].append(cpu)
                lat, cpu = in_process_ms(m, bodies * CPU_ROUNDS, e)
                work[e].append(lat)
                work_cpu[e].append(cpu)
            lat, cpu = timed(floor_port, floor_pid, "/noop")
            floor.append(lat)
            floor_cpu.append(cpu)
    f, fc = best_median(floor), min(floor_cpu)
    print(f"{which}; task {args.task}; {what} ({np.mean([len(b) for b in bodies]) / 1e3:.1f} "
          f"kB); {os.cpu_count()} cores; load average before: {load_before}, after: "
          f"{loadavg()}")
    print(f"HTTP floor (bare uvicorn, async route reading the body): p50 {f:.3f} ms, "
          f"{fc:.3f} CPU ms per request")
    print("| explain | in-process p50 ms | served p50 ms | served - floor ms | "
          "(served - floor) / in-process | in-process CPU ms | served CPU ms | "
          "(served - floor) / in-process, CPU |")
    print("|---|---|---|---|---|---|---|---|")
    for e in EXPLAINS:
        w, s = best_median(work[e]), best_median(served[e])
        wc, sc = min(work_cpu[e]), min(served_cpu[e])
        print(f"| {e} | {w:.3f} | {s:.3f} | {s - f:.3f} | {(s - f) / w:.2f} | {wc:.3f} | "
              f"{sc:.3f} | {(sc - fc) / wc:.2f} |")


if __name__ == "__main__":
    main()
