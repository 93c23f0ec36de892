"""64 concurrent clients sending single-stay requests: micro-batcher on vs off.

    .venv/bin/python benchmarks/bench_batcher.py [--clients 64] [--seconds 8] [--task mortality]
        [--device cpu] [--explain basic|top] [--sizes 32 1]

Off = SCEHR_MAX_BATCH_SIZE=1, on = 32 (queue delay 0, the default, in both); `--sizes` runs
other sizes, the ratio is the first's throughput over the last's. `--explain top` (the
single-stay default) sends ~30 occlusion rows per stay, so a size below that splits every
request over several runs and a size of 32 never lets two requests share one. Prints throughput
and p50/p99 latency of both; where the server's time goes per request (from its own /metrics:
validate+tensorize, queue, ORT compute, the rest = HTTP + FastAPI + pydantic + read-outs +
response serialization) and its CPU time per request (from /proc); ORT time alone, in-process
(one batch of 32 vs 32 single runs). Outputs must agree (batched vs single ORT runs, and the
servers' probabilities with the batcher on vs off, within 1e-5) or the script exits non-zero;
timings are only printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
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
from payloads import default_model_stays

from scehr.schemas.payloads import StayPayload
from scehr.service.batcher import ModelInputs, concat_outputs
from scehr.service.pipeline import prepare
from scehr.service.registry import load_model, read_index, resolve
from scehr.service.settings import Settings

TOL = 1e-5


async def load(port: int, bodies: list[bytes], clients: int, seconds: float,
               path: str) -> tuple[list[float], int, float, dict[int, bytes]]:
    lat: list[float] = []
    errors = 0
    replies: dict[int, bytes] = {}  # last reply per body, to compare the two servers
    stop = time.perf_counter() + seconds

    async def client(k: int) -> None:
        nonlocal errors
        conn = await Conn.open(port)
        i = k
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            status, reply = await conn.send(post(path, bodies[i % len(bodies)]))
            if status == 200:
                lat.append(time.perf_counter() - t0)
                replies[i % len(bodies)] = reply
            else:
                errors += 1
            i += clients
        conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(clients)))
    return lat, errors, time.perf_counter() - t0, replies


async def scrape(port: int) -> str:
    conn = await Conn.open(port)
    _, body = await conn.send(b"GET /metrics HTTP/1.1\r\nHost: b\r\n\r\n")
    conn.close()
    return body.decode()


def ort_alone(model, stays: list[dict], reps: int = 20) -> tuple[float, float, float]:
    """Per-stay ORT ms, one batch of len(stays) vs len(stays) runs of batch 1 (best of reps),
    and the largest difference between the two paths' probabilities."""
    prep = prepare(model.spec, [StayPayload.model_validate(s) for s in stays])
    x = prep.inputs
    n = x.rows
    singles = [ModelInputs(x.x[i : i + 1], x.lengths[i : i + 1],
                           None if x.static is None else x.static[i : i + 1]) for i in range(n)]
    diff = float(np.abs(model.run(x).probability
                        - concat_outputs([model.run(s) for s in singles]).probability).max())
    best_b = best_1 = np.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        model.run(x)
        best_b = min(best_b, time.perf_counter() - t0)
        t0 = time.perf_counter()
        for s in singles:
            model.run(s)
        best_1 = min(best_1, time.perf_counter() - t0)
    return best_b / n * 1e3, best_1 / n * 1e3, diff


def probabilities(reply: bytes) -> list[float]:
    """The scores of a reply: none for a stay below the model's data minimum."""
    return [c["score"] for c in json.loads(reply)["results"]]


def gap(a: list[float], b: list[float]) -> float:
    """Largest score difference of two replies for one stay (inf if only one was scored)."""
    if len(a) != len(b):
        return float("inf")
    return float(np.abs(np.subtract(a, b)).max()) if a else 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--task", default="mortality")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"],
                    help="SCEHR_DEVICE of the server and of the in-process session")
    ap.add_argument("--explain", default="basic", choices=["basic", "top"])
    ap.add_argument("--sizes", type=int, nargs="+", default=[32, 1],
                    help="SCEHR_MAX_BATCH_SIZE of each server run, in order")
    args = ap.parse_args()
    load_before = loadavg()
    models, which = model_dir()
    model = load_model(resolve(models, read_index(models), args.task), args.task,
                       Settings(model_dir=models, device=args.device))
    stays, what = default_model_stays(args.task, 256, models)
    bodies = [dumps(s) for s in stays]
    path = f"/predict/{args.task}?explain={args.explain}"
    print(f"models: {which}; {describe(model)}; {what}; {os.cpu_count()} cores; "
          f"load average before: {load_before}")
    print(f"{args.clients} clients x {args.seconds:g} s; one stay per request, "
          f"explain={args.explain}")
    results, replies = {}, {}
    labels = [f"batcher max {n}" + (" (off)" if n == 1 else "") for n in args.sizes]
    for label, size in zip(labels, args.sizes, strict=True):
        with server(models, device=args.device, max_batch_size=size, max_queue_size=1024) as srv:
            asyncio.run(load(srv.port, bodies, args.clients, 1.0, path))  # warm
            before = asyncio.run(scrape(srv.port))
            cpu0, client0 = srv.cpu_seconds(), time.process_time()
            lat, errors, wall, replies[label] = asyncio.run(
                load(srv.port, bodies, args.clients, args.seconds, path))
            cpu1, client1 = srv.cpu_seconds(), time.process_time()
            after = asyncio.run(scrape(srv.port))
        n = len(lat)
        rps = n / wall
        results[label] = rps
        print(f"{label}: {rps:7.1f} req/s  p50 {pct(lat, 50) * 1e3:6.1f} ms  "
              f"p99 {pct(lat, 99) * 1e3:6.1f} ms  errors {errors}")
        parts = {}
        for name in ("scehr_request_duration_seconds", "scehr_preprocess_seconds",
                     "scehr_queue_seconds", "scehr_compute_seconds", "scehr_batch_size"):
            s1, c1 = metric_sums(after, name, args.task)
            s0, c0 = metric_sums(before, name, args.task)
            parts[name] = (s1 - s0, c1 - c0)
        req_s, req_n = parts["scehr_request_duration_seconds"]
        pre = parts["scehr_preprocess_seconds"][0] / req_n * 1e3
        queue = parts["scehr_queue_seconds"][0] / req_n * 1e3
        comp_s, runs = parts["scehr_compute_seconds"]
        rows = parts["scehr_batch_size"][0]
        total = req_s / req_n * 1e3
        print(f"    server time per request: total {total:.2f} ms = validate+tensorize "
              f"{pre:.2f} + queue {queue:.2f} + other {total - pre - queue:.2f} ms; ORT "
              f"{comp_s / max(runs, 1) * 1e3:.2f} ms per run, mean batch "
              f"{rows / max(runs, 1):.1f} rows, ORT per request {comp_s / req_n * 1e3:.3f} ms")
        print(f"    CPU per request: server {(cpu1 - cpu0) / n * 1e3:.2f} ms "
              f"({(cpu1 - cpu0) / wall:.2f} cores busy), load generator "
              f"{(client1 - client0) / n * 1e3:.2f} ms ({(client1 - client0) / wall:.2f} cores)")
    on, off = results[labels[0]], results[labels[-1]]
    print(f"throughput ratio {labels[0]} / {labels[-1]} = {on / off:.2f} (target >= 1.5)")
    b, one, diff = ort_alone(model, stays[:32])
    print(f"ORT alone per stay (in-process): batch of 32 {b:.3f} ms vs batch 1 {one:.3f} ms "
          f"({one / b:.1f}x); max |p(batch) - p(single)| = {diff:.1e}")
    a, z = replies[labels[0]], replies[labels[-1]]
    common = sorted(a.keys() & z.keys())
    served = max(gap(probabilities(a[i]), probabilities(z[i])) for i in common)
    print(f"servers on vs off: max |p| difference over {len(common)} stays = {served:.1e}")
    if diff > TOL or served > TOL or not common:
        print(f"outputs differ by more than {TOL:g}")
        sys.exit(1)


if __name__ == "__main__":
    main()
