"""Goodput under overload: closed-loop clients at 64, then at 1,024, against one server.

    .venv/bin/python benchmarks/bench_overload.py [--seconds 20] [--low 64] [--high 1024]
        [--task mortality] [--hours 48]

Each client holds one keep-alive connection and sends single-stay requests back to back; on a
503 it waits the server's Retry-After (with 10% jitter), as a well-behaved client does, and
reconnects if the server closed the idle connection meanwhile. Prints, per level: successful
requests/s (goodput), p50/p99 latency of the successes, 503s/s and their p99, and other
statuses (must be 0); then goodput(high) / throughput(low). Both levels run side by side
on the same server and machine, so the ratio is what counts: on a shared machine the absolute
figures are inflated by other load (the load average is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import time
from collections import Counter
from collections.abc import Callable

from common import Conn, dumps, loadavg, model_dir, pct, post, server
from payloads import default_model_stays


async def send(conn: Conn, raw: bytes) -> tuple[int, bytes, float]:
    """Status, body and Retry-After (seconds, 1 when absent)."""
    conn.writer.write(raw)
    await conn.writer.drain()
    head = await conn.reader.readuntil(b"\r\n\r\n")
    length, retry = 0, 1.0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
        elif name.lower() == b"retry-after":
            retry = float(value)
    return int(head[9:12]), await conn.reader.readexactly(length), retry


def raise_fd_limit(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))


async def closed_loop(port: int, clients: int, seconds: float, bodies: list[bytes],
                      path: str, cpu: Callable[[], float], settle: float = 0.0,
                      greedy: bool = False) -> dict[str, object]:
    """Clients for `settle` + `seconds`; only answers in the last `seconds` count (the
    first `settle` seconds hold the connection burst of a cold start). `greedy` clients
    resend at once on a 503, ignoring Retry-After."""
    ok: list[float] = []
    busy: list[float] = []
    other: Counter[int] = Counter()
    start = time.perf_counter() + settle
    stop = start + seconds

    async def client(k: int) -> None:
        conn = await Conn.open(port)
        i = k
        try:
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                raw = post(path, bodies[i % len(bodies)])
                try:
                    status, _, retry = await send(conn, raw)
                except (asyncio.IncompleteReadError, ConnectionError):  # idle keep-alive closed
                    conn.close()
                    conn = await Conn.open(port)
                    t0 = time.perf_counter()
                    status, _, retry = await send(conn, raw)
                dt = time.perf_counter() - t0
                i += clients
                now = time.perf_counter()
                if now > stop:  # answered after the window: not counted
                    break
                if now < start:  # still settling
                    if status == 503 and not greedy:
                        await asyncio.sleep(retry)
                    continue
                if status == 200:
                    ok.append(dt)
                elif status == 503:
                    busy.append(dt)
                    if greedy:
                        continue
                    wait = retry * random.uniform(0.9, 1.1)  # Retry-After, within the window
                    await asyncio.sleep(max(0.0, min(wait, stop - time.perf_counter())))
                else:
                    other[status] += 1
        finally:
            conn.close()

    c0, s0 = time.process_time(), cpu()
    await asyncio.gather(*(client(k) for k in range(clients)))
    wall = seconds
    return {"clients": clients, "wall": wall, "ok": ok, "busy": busy, "other": dict(other),
            "client_cpu": (time.process_time() - c0) / wall, "server_cpu": (cpu() - s0) / wall}


def report(r: dict) -> str:
    ok, busy, wall = r["ok"], r["busy"], r["wall"]
    line = (f"{r['clients']:5d} clients: goodput {len(ok) / wall:7.1f} req/s  "
            f"p50 {pct(ok, 50) * 1e3:7.1f} ms  p99 {pct(ok, 99) * 1e3:7.1f} ms")
    if busy:
        line += f"  | 503 {len(busy) / wall:6.1f}/s p99 {pct(busy, 99) * 1e3:6.1f} ms"
    return line + (f"  | other statuses {r['other'] or 0}  | cores used: server "
                   f"{r['server_cpu']:.2f}, client {r['client_cpu']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--settle", type=float, default=5.0,
                    help="seconds at each level before counting (the connection burst)")
    ap.add_argument("--low", type=int, default=64)
    ap.add_argument("--high", type=int, default=1024)
    ap.add_argument("--task", default="mortality")
    ap.add_argument("--hours", type=int, default=48)
    args = ap.parse_args()
    raise_fd_limit(4 * args.high + 256)
    load = loadavg()
    models, which = model_dir()
    bodies = [dumps(s) for s in default_model_stays(args.task, 64, models, args.hours,
                                                     real=False)[0]]
    path = f"/predict/{args.task}"
    with server(models) as srv:
        async def both() -> tuple[dict, dict]:
            cpu = srv.cpu_seconds
            await closed_loop(srv.port, 8, 2.0, bodies, path, cpu)  # warm-up
            low = await closed_loop(srv.port, args.low, args.seconds, bodies, path, cpu,
                                    args.settle)
            high = await closed_loop(srv.port, args.high, args.seconds, bodies, path, cpu,
                                     args.settle)
            return low, high
        low, high = asyncio.run(both())
    print(f"models: {which}; default settings; load average before: {load}; "
          f"{args.seconds:.0f} s counted per level after {args.settle:.0f} s settling")
    print(report(low))
    print(report(high))
    ratio = (len(high["ok"]) / high["wall"]) / (len(low["ok"]) / low["wall"])
    print(f"goodput at {args.high} / throughput at {args.low}: {ratio:.2f}")


if __name__ == "__main__":
    main()
