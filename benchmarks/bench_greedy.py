"""Clients that ignore Retry-After against clients that honour it, side by side, with probes.

    .venv/bin/python benchmarks/bench_greedy.py [--clients 512] [--seconds 20]

The same number of closed-loop clients (`bench_overload.closed_loop`: one keep-alive
connection each, single full 48 h stays to /predict/mortality) run twice against one server
with default settings: first honouring Retry-After, then resending at once on every 503.
Meanwhile a probe calls /livez and /readyz every 100 ms on fresh connections with a 1 s
timeout, as a kubelet does. Prints goodput (200/s), p50/p99 of the successes, 503/s, the
probes missed and their p99, and goodput(greedy) / goodput(polite). Printed, never asserted;
the load average is printed (figures on a shared machine are inflated by other load).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from bench_overload import closed_loop, raise_fd_limit, report
from common import dumps, loadavg, model_dir, pct, read_response, server
from payloads import default_model_stays


async def probe(port: int, stop: float) -> tuple[list[float], int]:
    took, missed = [], 0
    paths = [b"/livez", b"/readyz"]
    i = 0
    while time.perf_counter() < stop:
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(1.0):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET " + paths[i % 2] + b" HTTP/1.1\r\nHost: p\r\n\r\n")
                status, _ = await read_response(reader)
                writer.close()
            took.append(time.perf_counter() - t0)
            missed += status != 200
        except (TimeoutError, OSError, asyncio.IncompleteReadError):
            missed += 1
        i += 1
        await asyncio.sleep(0.1)
    return took, missed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=512)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--settle", type=float, default=5.0)
    args = ap.parse_args()
    raise_fd_limit(4 * args.clients + 256)
    load = loadavg()
    models, which = model_dir()
    bodies = [dumps(s) for s in default_model_stays("mortality", 64, models, 48,
                                                     real=False)[0]]
    results = {}
    with server(models) as srv:
        async def run(greedy: bool) -> None:
            stop = time.perf_counter() + args.settle + args.seconds
            load_run = closed_loop(srv.port, args.clients, args.seconds, bodies,
                                   "/predict/mortality", srv.cpu_seconds, args.settle,
                                   greedy=greedy)
            r, p = await asyncio.gather(load_run, probe(srv.port, stop))
            results[greedy] = (r, p)
        asyncio.run(run(False))
        asyncio.run(run(True))
    print(f"models: {which}; default settings; load average before: {load}, after: "
          f"{loadavg()}; {args.seconds:.0f} s counted after {args.settle:.0f} s settling")
    for greedy in (False, True):
        r, (took, missed) = results[greedy]
        print(("ignoring " if greedy else "honouring") + " Retry-After: " + report(r))
        print(f"    probes /livez+/readyz: {len(took) + missed} sent, {missed} missed (1 s), "
              f"p99 {pct(took, 99) * 1e3:.1f} ms, max {max(took) * 1e3:.1f} ms")
    polite, greedy = (len(results[g][0]["ok"]) for g in (False, True))
    print(f"goodput ignoring / honouring Retry-After: {greedy / max(polite, 1):.2f}")


if __name__ == "__main__":
    main()
