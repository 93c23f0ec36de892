"""Where one single-stay request's CPU goes, stage by stage, in-process (no HTTP).

    .venv/bin/python benchmarks/profile_stages.py [--task mortality] [--stays 200] [--passes 3]
        [--source DIR] [--explain basic|top|full] [--long-form] [--bytes MIN MAX]

Real test stays (benchmarks/payloads.py; without the converted data, synthetic ones in the
model's feature set), one at a time: parse + validate the bytes (json.loads + model_validate,
as a FastAPI body parameter does, and model_validate_json, as the single-stay route does now),
ingest + tensorize (`scehr.service.pipeline.prepare`), ORT at batch 1 (one intra-op thread, so it
runs on the calling thread), read-outs (`predictions`), response JSON. Each stage is timed with
the thread's CPU clock (`time.thread_time`), which a busy shared machine inflates far less than
wall time, and with the wall clock; medians over stays, best of `--passes` passes. `--source
DIR` runs the same stages on another checkout's code (e.g. `git archive <commit> | tar -x -C
DIR`), for before/after figures. Then the whole app on the same bodies, in-process through ASGI
(no sockets, no HTTP server): what the service adds around those stages (routing, middleware,
admission, metrics, monitoring, access and audit logs; ORT inline as for a lone request):
the median over requests of the thread's CPU time with ORT at one intra-op thread, as the
stages above (every step of a lone light request runs on this thread), which compares with
their sum; and the mean of the process's CPU time (`time.process_time`: ORT's threads and
any worker thread included) with the served ORT settings, as a server spends it.
`--explain` (default basic) profiles that explanation depth: `top`, the single-stay route's
default, adds the occlusion rows to ingest + tensorize and ORT and the contributions to the
read-outs. `--long-form` sends the stays as a hospital's system would (LOINC-coded
`observations`), `--bytes MIN MAX` keeps the bodies of that size (e.g. the long stays of
32-64 kB, which the default SCEHR_OFFLOAD_BYTES decides about). Only prints.
"""

from __future__ import annotations

import sys

if "--source" in sys.argv:  # before anything imports service/ or schemas/
    _src = sys.argv[sys.argv.index("--source") + 1]
    sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f)]
    sys.path.insert(0, _src)
    import scehr

    # `git archive` gives scehr/ beside service/ and schemas/, which setup.py maps into it
    scehr.__path__.append(_src)
    # Bound to that checkout now: benchmarks/common.py puts this repository first on the path.
    import scehr.schemas
    import scehr.service

import argparse
import asyncio
import contextlib
import gc
import json
import os
import time
from typing import Any

import numpy as np
from common import dumps, loadavg, model_dir
from payloads import default_model_stays

from scehr.schemas.payloads import StayPayload
from scehr.service.explain import LEVELS
from scehr.service.pipeline import prepare
from scehr.service.registry import load_model, read_index, resolve
from scehr.service.responses import predictions
from scehr.service.settings import Settings

STAGES = ("json.loads + model_validate", "model_validate_json", "ingest + tensorize",
          "ORT, the stay's run (1 thread)", "read-outs (predictions)", "response JSON")


def one_pass(m, bodies: list[bytes], explain: str) -> dict[str, tuple[float, float]]:
    cpu: dict[str, list[float]] = {k: [] for k in STAGES}
    wall: dict[str, list[float]] = {k: [] for k in STAGES}
    for b in bodies:
        c: list[float] = [time.thread_time()]
        w: list[float] = [time.perf_counter()]

        def mark(c: list[float] = c, w: list[float] = w) -> None:
            c.append(time.thread_time())
            w.append(time.perf_counter())

        StayPayload.model_validate(json.loads(b))
        mark()
        stay = StayPayload.model_validate_json(b)
        mark()
        prep = prepare(m.spec, [stay], occlusion=LEVELS[explain].occlusion)
        mark()
        out = m.run(prep.inputs)
        mark()
        pred = predictions(m.spec, prep, out, explain=explain)[0]
        mark()
        pred.model_dump_json()
        mark()
        for i, k in enumerate(STAGES):
            cpu[k].append((c[i + 1] - c[i]) * 1e3)
            wall[k].append((w[i + 1] - w[i]) * 1e3)
    return {k: (float(np.median(cpu[k])), float(np.median(wall[k]))) for k in STAGES}


async def asgi_cpu_ms(bodies: list[bytes], task: str, models: object, passes: int,
                      explain: str) -> tuple[float, float]:
    """CPU ms per request of the whole app called in-process, best of `passes`: the median
    over requests of this thread's CPU time, with ORT at one intra-op thread as in the stages
    above (a lone light request runs everything on this thread), so that it compares with
    their sum; and the mean of the process's CPU time with the served ORT settings."""
    from scehr.service.app import create_app

    one = create_app(Settings(model_dir=models, device="cpu", workers=1, intra_op_threads=1))
    served = create_app(Settings(model_dir=models, device="cpu", workers=1))
    path = f"/predict/{task}"

    async def call(app: Any, body: bytes) -> None:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
                 "query_string": f"explain={explain}".encode(), "root_path": "",
                 "headers": [(b"host", b"bench"), (b"content-type", b"application/json"),
                             (b"content-length", str(len(body)).encode())],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
        sent: list[dict] = []

        async def receive() -> dict:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        await app(scope, receive, send)
        if sent[0]["status"] != 200:
            raise RuntimeError(f"status {sent[0]['status']}: {sent[-1].get('body', b'')[:300]!r}")

    async with one.router.lifespan_context(one), served.router.lifespan_context(served):
        for app in (one, served):
            while not app.state.registry.ready:
                await asyncio.sleep(0.05)
            for b in bodies[:20]:
                await call(app, b)
        median = mean = float("inf")
        for _ in range(passes):
            each = []
            for b in bodies:
                t0 = time.thread_time()
                await call(one, b)
                each.append(time.thread_time() - t0)
            median = min(median, float(np.median(each)) * 1e3)
            t0 = time.process_time()
            for b in bodies:
                await call(served, b)
            mean = min(mean, (time.process_time() - t0) / len(bodies) * 1e3)
    return median, mean


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="mortality")
    ap.add_argument("--stays", type=int, default=200)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--source", help="another checkout whose service/ and schemas/ to time")
    ap.add_argument("--explain", default="basic", choices=["basic", "top", "full"])
    ap.add_argument("--long-form", action="store_true", help="send the stays as LOINC-coded "
                    "long form (`request_cpu_shares.loinc_body`), not as wide tables")
    ap.add_argument("--bytes", type=int, nargs=2, metavar=("MIN", "MAX"),
                    help="only the bodies of MIN < bytes <= MAX (e.g. 32768 65536)")
    args = ap.parse_args()
    load_before = loadavg()
    models, which = model_dir()
    m = load_model(resolve(models, read_index(models), args.task), args.task,
                   Settings(model_dir=models, device="cpu", intra_op_threads=1))
    stays, what = default_model_stays(args.task, args.stays, models)
    bodies = [dumps(s) for s in stays]
    if args.long_form:
        from request_cpu_shares import loinc_body

        by_name = {n: v for v in m.spec.fs.variables for n in (v.id, v.benchmark_name)}
        bodies = [loinc_body(s, by_name) for s in stays]
        what += " as LOINC-coded long form"
    if args.bytes:
        low, high = args.bytes
        bodies = [b for b in bodies if low < len(b) <= high]
        what += f", the {len(bodies)} of {low}-{high} bytes"
    # As the server does once its models are loaded (service/registry.py): what is alive now
    # (models, payloads, pandas) leaves the collector's reach, so that the per-request
    # garbage collections do not scan this harness's own heap.
    gc.collect()
    gc.freeze()
    passes = [one_pass(m, bodies, args.explain) for _ in range(args.passes)]
    best = {k: (min(p[k][0] for p in passes), min(p[k][1] for p in passes)) for k in STAGES}
    code = args.source or "this checkout"
    print(f"{which}; task {args.task}; {what}; explain={args.explain}; code: {code}; "
          f"load average before: "
          f"{load_before}, after: {loadavg()}")
    print(f"| stage | CPU ms (median, best of {args.passes}) | wall ms |")
    print("|---|---|---|")
    for k in STAGES:
        print(f"| {k} | {best[k][0]:.3f} | {best[k][1]:.3f} |")
    for parse in STAGES[:2]:
        rest = list(STAGES[2:])
        print(f"| total with {parse} | {sum(best[k][0] for k in [parse, *rest]):.3f} | "
              f"{sum(best[k][1] for k in [parse, *rest]):.3f} |")
    with open(os.devnull, "w") as quiet, contextlib.redirect_stderr(quiet):  # its logs
        whole, served = asyncio.run(asgi_cpu_ms(bodies, args.task, models, args.passes,
                                                args.explain))
    print(f"| whole app in-process (ASGI, no sockets), per request: median, ORT 1 thread "
          f"| {whole:.3f} | – |")
    print(f"| the same, mean process CPU with the served ORT threads | {served:.3f} | – |")


if __name__ == "__main__":
    main()
