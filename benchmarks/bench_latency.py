"""Latency at concurrency 1 for a full 48-hour stay, next to raw ORT time for batch 1.

    .venv/bin/python benchmarks/bench_latency.py [--requests 300] [--task mortality]

Also prints an in-process profile of one request's stages (median over the same stays), to
show where the time goes when the model itself is small.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import numpy as np
from common import Conn, dumps, full_stay, model_dir, pct, post, server

from schemas.payloads import StayPayload
from service.pipeline import predictions, prepare
from service.registry import load_model, read_index, resolve
from service.settings import Settings


def stage_profile(models, task: str, bodies: list[bytes]) -> dict[str, list[float]]:
    folder = resolve(models, read_index(models), task)
    m = load_model(folder, task, Settings(model_dir=models, device="cpu"))
    st: dict[str, list[float]] = {k: [] for k in ("json.loads", "pydantic StayPayload",
                                                  "ingest+tensorize", "ORT batch 1",
                                                  "read-outs", "response JSON")}
    for b in bodies:
        t = [time.perf_counter()]
        raw = json.loads(b)
        t.append(time.perf_counter())
        stay = StayPayload.model_validate(raw)
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--task", default="mortality")
    args = ap.parse_args()
    models, which = model_dir()
    bodies = [dumps(full_stay(i)) for i in range(50)]
    path = f"/predict/{args.task}"

    async def run(port: int) -> list[float]:
        conn = await Conn.open(port)
        for b in bodies[:20]:
            await conn.send(post(path, b))
        lat = []
        for i in range(args.requests):
            t0 = time.perf_counter()
            status, _ = await conn.send(post(path, bodies[i % len(bodies)]))
            lat.append(time.perf_counter() - t0)
            assert status == 200
        conn.close()
        return lat

    with server(models) as port:
        lat = asyncio.run(run(port))
    st = stage_profile(models, args.task, bodies * 4)
    n_obs = np.mean([len(json.loads(b)["observations"]) for b in bodies])
    print(f"models: {which}; task {args.task}; CPU provider; {os.cpu_count()} cores; "
          f"{args.requests} sequential requests, full 48 h stays (~{n_obs:.0f} observations, "
          f"{np.mean([len(b) for b in bodies]) / 1e3:.0f} kB)")
    print(f"end to end (loopback HTTP): p50 {pct(lat, 50) * 1e3:.2f} ms  "
          f"p99 {pct(lat, 99) * 1e3:.2f} ms")
    ort = st["ORT batch 1"]
    print(f"raw ORT, batch 1:           p50 {pct(ort, 50):.3f} ms  p99 {pct(ort, 99):.3f} ms")
    total = sum(np.median(v) for v in st.values())
    print("in-process stages (median ms):")
    for k, v in st.items():
        print(f"    {k:24s} {np.median(v):7.3f}  ({np.median(v) / total:5.1%})")


if __name__ == "__main__":
    main()
