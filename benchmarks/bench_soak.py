"""Soak: many requests against one server; RSS growth after warm-up and errors.

    .venv/bin/python benchmarks/bench_soak.py [--requests 100000] [--clients 16]

A mix a real deployment sees (single stays of both tasks, small batches with a bad stay,
invalid bodies, unknown tasks and routes, scrapes) sent by `--clients` keep-alive clients.
Prints the server's RSS after a warm-up of 2,000 requests and at the end, the growth, and
every status other than the expected one (must be 0). The long run is the documented
100,000-request command; CI runs a bounded version (tests/service/test_svc_load.py).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from pathlib import Path

from common import Conn, dumps, loadavg, model_dir, post, server
from payloads import default_model_stays


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def mix(models: Path) -> list[tuple[bytes, int]]:
    """(raw request, expected status) cycled by the clients."""
    s = default_model_stays("mortality", 8, models, 24, real=False)[0]
    p = dict(default_model_stays("phenotypes", 2, models, 24, real=False)[0][1], end_hours=24.0)
    return [
        (post("/predict/mortality", dumps(s[0])), 200),
        (post("/predict/phenotypes", dumps(p)), 200),
        (post("/predict/mortality/batch", dumps({"stays": [s[2], {"wide": 1}, 42]})), 200),
        (post("/predict/mortality", b'{"observations": [{"variable": "x"}]}'), 422),
        (post("/predict/mortality", b"{not json"), 422),
        (post("/predict/no-such-task/batch", dumps({"stays": [s[3]]})), 404),
        (b"GET /no/such/route HTTP/1.1\r\nHost: b\r\n\r\n", 404),
        (post("/predict/mortality", dumps(dict(s[4], id="soak"))), 200),
        (b"GET /metrics HTTP/1.1\r\nHost: b\r\n\r\n", 200),
        (b"GET /models HTTP/1.1\r\nHost: b\r\n\r\n", 200),
    ]


async def soak(port: int, n: int, clients: int, requests: list[tuple[bytes, int]],
               ) -> Counter[str]:
    bad: Counter[str] = Counter()
    counter = iter(range(n))

    async def client() -> None:
        conn = await Conn.open(port)
        for i in counter:
            raw, want = requests[i % len(requests)]
            status, _ = await conn.send(raw)
            if status != want:
                bad[f"{raw.split(b' ')[1].decode()} -> {status} (want {want})"] += 1
        conn.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return bad


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--clients", type=int, default=16)
    args = ap.parse_args()
    load = loadavg()
    models, which = model_dir()
    requests = mix(models)
    with server(models) as srv:
        asyncio.run(soak(srv.port, 2000, args.clients, requests))
        before = rss_mib(srv.pid)
        t0 = time.perf_counter()
        bad = asyncio.run(soak(srv.port, args.requests, args.clients, requests))
        wall = time.perf_counter() - t0
        after = rss_mib(srv.pid)
    print(f"models: {which}; load average before: {load}")
    print(f"{args.requests} requests in {wall:.0f} s ({args.requests / wall:.0f} req/s), "
          f"{args.clients} clients")
    print(f"RSS after warm-up {before:.1f} MiB, at the end {after:.1f} MiB: "
          f"growth {after - before:+.1f} MiB")
    print(f"unexpected statuses: {sum(bad.values())} {dict(bad) or ''}")


if __name__ == "__main__":
    main()
