"""In-process pipeline vs the batch endpoint over loopback HTTP: same stays, one run each.

    .venv/bin/python benchmarks/bench_parity.py [--stays 1024] [--batch 64] [--task mortality]

In-process = json.loads + per-stay pydantic validation + ingest/tensorize + ORT + read-outs
(the exact functions the route calls, without HTTP or response serialization). HTTP = the same
request bodies POSTed one after another to a real `scehr serve` process. Target: ratio >= 0.7.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

from common import Conn, dumps, full_stay, model_dir, post, server

from service.batcher import run_chunked
from service.pipeline import parse_stays, predictions, prepare
from service.registry import load_model, read_index, resolve
from service.settings import Settings


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stays", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--task", default="mortality")
    args = ap.parse_args()
    models, which = model_dir()
    stays = [full_stay(i) for i in range(args.stays)]
    bodies = [dumps({"stays": stays[i : i + args.batch]})
              for i in range(0, len(stays), args.batch)]
    n_obs = sum(len(s["observations"]) for s in stays) / len(stays)

    settings = Settings(model_dir=models, device="cpu")
    folder = resolve(models, read_index(models), args.task)
    model = load_model(folder, args.task, settings)

    def in_process(body: bytes) -> int:
        parsed = parse_stays(json.loads(body)["stays"])
        good = [s for s in parsed if not isinstance(s, list)]
        prep = prepare(model.spec, good, max_observations=settings.max_observations)
        out = run_chunked(model.run, prep.inputs, settings.max_batch_size)
        return len(predictions(model.spec, prep, out))

    in_process(bodies[0])  # warm
    t0 = time.perf_counter()
    scored = sum(in_process(b) for b in bodies)
    t_in = time.perf_counter() - t0
    assert scored == len(stays)

    async def over_http(port: int) -> float:
        conn = await Conn.open(port)
        path = f"/predict/{args.task}/batch"
        status, _ = await conn.send(post(path, bodies[0]))  # warm
        assert status == 200
        t0 = time.perf_counter()
        for b in bodies:
            status, _ = await conn.send(post(path, b))
            assert status == 200
        conn.close()
        return time.perf_counter() - t0

    with server(models) as port:
        t_http = asyncio.run(over_http(port))

    rate_in, rate_http = len(stays) / t_in, len(stays) / t_http
    print(f"models: {which}; task {args.task}; provider CPUExecutionProvider; "
          f"{os.cpu_count()} cores")
    print(f"{len(stays)} stays (~{n_obs:.0f} observations each) in {len(bodies)} requests of "
          f"{args.batch}; request body {len(bodies[0]) / 1e6:.2f} MB")
    print(f"in-process pipeline : {rate_in:8.1f} stays/s  ({t_in:.2f} s)")
    print(f"batch endpoint HTTP : {rate_http:8.1f} stays/s  ({t_http:.2f} s)")
    print(f"ratio HTTP / in-process = {rate_http / rate_in:.2f} (target >= 0.7)")


if __name__ == "__main__":
    main()
