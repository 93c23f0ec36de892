"""Goodput under overload: closed-loop clients at 64, then at 1,024, against one server.

    .venv/bin/python benchmarks/bench_overload.py [--seconds 20] [--low 64] [--high 1024]
        [--task mortality] [--hours 48]

Each client holds one keep-alive connection and sends single-stay requests back to back; on a
503 it waits the server's Retry-After, as a well-behaved client does. Prints, per level:
successful requests/s (goodput), p50/p99 latency of the successes, 503s/s and their p99, and
other statuses (must be 0); then goodput(high) / throughput(low). Both levels run side by side
on the same server and machine, so the ratio is what counts: on a shared machine the absolute
figures are inflated by other load (the load average is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time
from collections import Counter

from common import Conn, dumps, full_stay, loadavg, model_dir, pct, post, server


def raise_fd_limit(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))


async def closed_loop(port: int, clients: int, seconds: float, bodies: list[bytes],
                      path: str) -> dict[str, object]:
    ok: list[float] = []
    busy: list[float] = []
    other: Counter[int] = Counter()
    stop = time.perf_counter() + seconds

    async def client(k: int) -> None:
        conn = await Conn.open(port)
        i = k
        try:
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                status, _ = await conn.send(post(path, bodies[i % len(bodies)]))
                dt = time.perf_counter() - t0
                i += clients
                if status == 200:
                    ok.append(dt)
                elif status == 503:
                    busy.append(dt)
                    await asyncio.sleep(1.0)  # Retry-After
                else:
                    other[status] += 1
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(clients)))
    wall = time.perf_counter() - t0
    return {"clients": clients, "wall": wall, "ok": ok, "busy": busy, "other": dict(other)}


def report(r: dict) -> str:
    ok, busy, wall = r["ok"], r["busy"], r["wall"]
    line = (f"{r['clients']:5d} clients: goodput {len(ok) / wall:7.1f} req/s  "
            f"p50 {pct(ok, 50) * 1e3:7.1f} ms  p99 {pct(ok, 99) * 1e3:7.1f} ms")
    if busy:
        line += f"  | 503 {len(busy) / wall:6.1f}/s p99 {pct(busy, 99) * 1e3:6.1f} ms"
    return line + f"  | other statuses {r['other'] or 0}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--low", type=int, default=64)
    ap.add_argument("--high", type=int, default=1024)
    ap.add_argument("--task", default="mortality")
    ap.add_argument("--hours", type=int, default=48)
    args = ap.parse_args()
    raise_fd_limit(4 * args.high + 256)
    load = loadavg()
    models, which = model_dir()
    bodies = [dumps(full_stay(i, args.hours)) for i in range(64)]
    path = f"/predict/{args.task}"
    with server(models) as srv:
        async def both() -> tuple[dict, dict]:
            await closed_loop(srv.port, 8, 2.0, bodies, path)  # warm-up
            low = await closed_loop(srv.port, args.low, args.seconds, bodies, path)
            high = await closed_loop(srv.port, args.high, args.seconds, bodies, path)
            return low, high
        low, high = asyncio.run(both())
    print(f"models: {which}; default settings; load average before: {load}")
    print(report(low))
    print(report(high))
    ratio = (len(high["ok"]) / high["wall"]) / (len(low["ok"]) / low["wall"])
    print(f"goodput at {args.high} / throughput at {args.low}: {ratio:.2f}")


if __name__ == "__main__":
    main()
