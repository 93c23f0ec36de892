"""Latency at concurrency 1 for one full stay, next to raw ORT time for batch 1.

    .venv/bin/python benchmarks/bench_latency.py [--requests 300] [--task mortality] [--hours 48]
        [--device cpu] [--real 200] [--workers 1]

One keep-alive connection sends `--requests` single-stay requests one after another (stays of
`--hours` hours; phenotypes stays carry `end_hours`). Also prints the server's own mean ORT
time per request (from /metrics, same requests) and an in-process profile of one request's
stages (medians over the same stays, ORT batch 1 included), to show where the time goes.
Timings are only printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import numpy as np
from common import (
    Conn,
    describe,
    dumps,
    loadavg,
    metric_sums,
    model_dir,
    pct,
    post,
    server,
)
from payloads import default_model_stays, real_stays

from scehr.schemas.payloads import StayPayload
from scehr.service.pipeline import prepare
from scehr.service.registry import load_model, read_index, resolve
from scehr.service.responses import predictions
from scehr.service.settings import Settings

#: The request parse before this commit's fast path (FastAPI's body parameter: json.loads, then
#: validation of the dict) and now (pydantic validates while parsing the bytes).
BEFORE, NOW = "json.loads + model_validate (before)", "model_validate_json (now)"


def stage_profile(m, bodies: list[bytes]) -> dict[str, list[float]]:
    st: dict[str, list[float]] = {k: [] for k in (BEFORE, NOW, "ingest+tensorize",
                                                  "ORT batch 1", "read-outs", "response JSON")}
    for b in bodies:
        t = [time.perf_counter()]
        StayPayload.model_validate(json.loads(b))
        t.append(time.perf_counter())
        stay = StayPayload.model_validate_json(b)
        t.append(time.perf_counter())
        prep = prepare(m.spec, [stay])
        t.append(time.perf_counter())
        out = m.run(prep.inputs)
        t.append(time.perf_counter())
        pred = predictions(m.spec, prep, out)[0]
        t.append(time.perf_counter())
        pred.model_dump_json()
        t.append(time.perf_counter())
        for k, a, z in zip(st, t[:-1], t[1:], strict=True):
            st[k].append((z - a) * 1e3)
    return st


async def scrape(conn: Conn) -> str:
    return (await conn.send(b"GET /metrics HTTP/1.1\r\nHost: b\r\n\r\n"))[1].decode()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--task", default="mortality")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"],
                    help="SCEHR_DEVICE of the server and of the in-process session")
    ap.add_argument("--hours", type=int, default=48)
    ap.add_argument("--real", type=int, default=0, metavar="N",
                    help="N real test stays (benchmarks/payloads.py) instead of synthetic ones")
    ap.add_argument("--workers", type=int, default=1, help="scehr serve --workers")
    args = ap.parse_args()
    load_before = loadavg()
    models, which = model_dir()
    found = real_stays(args.task, args.real, models) if args.real else None
    if found is not None:
        stays, what = found
    else:
        stays, what = default_model_stays(args.task, 50, models, args.hours, real=False)
    bodies = [dumps(s) for s in stays]
    del stays  # as in bench_parity.py: keep this process's heap small for the in-process profile
    path = f"/predict/{args.task}?explain=basic"  # the 1.0 default: no occlusion rows

    async def run(port: int) -> tuple[list[float], float]:
        conn = await Conn.open(port)
        for b in bodies[:20]:
            await conn.send(post(path, b))
        before = await scrape(conn)
        lat = []
        for i in range(args.requests):
            t0 = time.perf_counter()
            status, _ = await conn.send(post(path, bodies[i % len(bodies)]))
            lat.append(time.perf_counter() - t0)
            assert status == 200
        after = await scrape(conn)
        conn.close()
        (s1, c1), (s0, c0) = (metric_sums(t, "scehr_compute_seconds", args.task)
                              for t in (after, before))
        return lat, (s1 - s0) / (c1 - c0) * 1e3

    with server(models, device=args.device, workers=args.workers) as srv:
        lat, server_ort = asyncio.run(run(srv.port))
    m = load_model(resolve(models, read_index(models), args.task), args.task,
                   Settings(model_dir=models, device=args.device))
    st = stage_profile(m, bodies * 4)
    print(f"models: {which}; {describe(m)}; {os.cpu_count()} cores; load average before: "
          f"{load_before}")
    print(f"{args.requests} sequential requests, {what} "
          f"({np.mean([len(b) for b in bodies]) / 1e3:.1f} kB)")
    print(f"end to end (loopback HTTP): p50 {pct(lat, 50) * 1e3:.2f} ms  "
          f"p99 {pct(lat, 99) * 1e3:.2f} ms")
    print(f"ORT inside the server:      mean {server_ort:.3f} ms per request (batch 1)")
    ort = st["ORT batch 1"]
    print(f"raw ORT, batch 1:           p50 {pct(ort, 50):.3f} ms  p99 {pct(ort, 99):.3f} ms")
    total = sum(np.median(v) for k, v in st.items() if k != BEFORE)
    print(f"in-process stages (median ms; total {total:.3f} with the parse of now, "
          f"{total - np.median(st[NOW]) + np.median(st[BEFORE]):.3f} with the one before):")
    for k, v in st.items():
        share = "" if k == BEFORE else f"  ({np.median(v) / total:5.1%})"
        print(f"    {k:38s} {np.median(v):7.3f}{share}")


if __name__ == "__main__":
    main()
