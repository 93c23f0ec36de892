"""/livez latency while the server does its heaviest valid work.

    .venv/bin/python benchmarks/bench_livez.py [--seconds 20] [--stays 256] [--senders 2]

`--senders` clients post `--stays`-stay phenotypes batches with `explain=full` back to back
(the largest batch the default settings accept, with occlusion: one ORT row per observed
channel per stay), a scraper reads /metrics every 0.5 s, and a probe calls /livez every 50 ms
on its own connection. Prints the probe's p50/p99/max (a liveness probe with a 1 s timeout must
never miss) and the batches done. Timings are printed, never asserted; on a shared machine they
are inflated by other load (the load average is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter

from common import Conn, dumps, loadavg, model_dir, pct, post, server
from payloads import default_model_stays

LIVEZ = b"GET /livez HTTP/1.1\r\nHost: b\r\n\r\n"
METRICS = b"GET /metrics HTTP/1.1\r\nHost: b\r\n\r\n"


async def run(port: int, seconds: float, body: bytes, senders: int) -> dict[str, object]:
    stop = time.perf_counter() + seconds
    probe: list[float] = []
    batches: list[float] = []
    statuses: list[int] = []

    async def sender() -> None:
        conn = await Conn.open(port)
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            status, _ = await conn.send(post("/predict/phenotypes/batch?explain=full", body))
            statuses.append(status)
            batches.append(time.perf_counter() - t0)
        conn.close()

    async def scraper() -> None:
        conn = await Conn.open(port)
        while time.perf_counter() < stop:
            statuses.append((await conn.send(METRICS))[0])
            await asyncio.sleep(0.5)
        conn.close()

    async def prober() -> None:
        conn = await Conn.open(port)
        await asyncio.sleep(0.5)  # let the first batch start
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            assert (await conn.send(LIVEZ))[0] == 200
            probe.append(time.perf_counter() - t0)
            await asyncio.sleep(0.05)
        conn.close()

    await asyncio.gather(*(sender() for _ in range(senders)), scraper(), prober())
    return {"probe": probe, "batches": batches, "statuses": statuses}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--stays", type=int, default=256)
    ap.add_argument("--senders", type=int, default=2)
    ap.add_argument("--hours", type=int, default=48)
    args = ap.parse_args()
    load = loadavg()
    models, which = model_dir()
    stays = [dict(s, end_hours=float(args.hours)) for s in default_model_stays(
        "phenotypes", args.stays, models, args.hours, real=False)[0]]
    body = dumps({"stays": stays})
    with server(models) as srv:
        r = asyncio.run(run(srv.port, args.seconds, body, args.senders))
    probe, batches = r["probe"], r["batches"]
    bad = Counter(s for s in r["statuses"] if s != 200)
    print(f"models: {which}; load average before: {load}")
    print(f"{args.senders} senders of {args.stays}-stay phenotypes explain=full batches "
          f"({len(body) / 1e6:.1f} MB each) + /metrics every 0.5 s, {args.seconds:.0f} s")
    print(f"batches done: {len(batches)} (median {pct(batches, 50):.2f} s each); "
          f"non-200 answers: {sum(bad.values())} {dict(bad) or ''}")
    print(f"/livez ({len(probe)} probes): p50 {pct(probe, 50) * 1e3:.1f} ms  "
          f"p99 {pct(probe, 99) * 1e3:.1f} ms  max {max(probe) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
