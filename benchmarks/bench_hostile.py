"""Hostile clients against a real server: stalled bodies, and FHIR bodies over a limit.

    .venv/bin/python benchmarks/bench_hostile.py [--stalled 64] [--polite 200]

1. `--stalled` connections send headers announcing 100,000 bytes of body, one byte, then
   nothing; meanwhile one polite client posts `--polite` full 48 h stays to /predict/mortality
   back to back. Prints the polite client's statuses and p50/p99, then how many stalled
   connections got 408 once the body deadline (`SCEHR_BODY_TIMEOUT_S`, 5 s here) passed.
2. FHIR bodies over a limit (2.7 M empty entries, 26,322 more Observations, extensions nested 300
   deep, a 309-digit value): the status, the rule and the server's CPU seconds per request
   (user + system of the server process, from /proc: less sensitive to other load than wall
   time; the load average is printed).
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import socket
import time
from collections import Counter
from typing import Any

from common import Conn, Server, dumps, loadavg, model_dir, pct, post, server
from payloads import default_model_stays

from tests.service.fhir_writer import example_bundle

BODY_TIMEOUT_S = 5.0


def stall(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"POST /predict/mortality HTTP/1.1\r\nHost: b\r\nContent-Type: application/json"
              b"\r\nContent-Length: 100000\r\n\r\n{")
    return s


async def polite(port: int, n: int, stays: list[dict[str, Any]]
                 ) -> tuple[Counter[int], list[float]]:
    conn = await Conn.open(port)
    statuses: Counter[int] = Counter()
    took: list[float] = []
    bodies = [post("/predict/mortality", dumps(s)) for s in stays]
    for i in range(n):
        t0 = time.perf_counter()
        status, _ = await conn.send(bodies[i % len(bodies)])
        took.append(time.perf_counter() - t0)
        statuses[status] += 1
    conn.close()
    return statuses, took


def stalled_bodies(srv: Server, n_stalled: int, n_polite: int,
                   stays: list[dict[str, Any]]) -> None:
    socks = [stall(srv.port) for _ in range(n_stalled)]
    t0 = time.monotonic()
    time.sleep(0.5)
    statuses, took = asyncio.run(polite(srv.port, n_polite, stays))
    print(f"[stalled bodies] {n_stalled} stalled connections; polite client: "
          f"{dict(statuses)}, p50 {pct(took, 50) * 1e3:.1f} ms, p99 {pct(took, 99) * 1e3:.1f} ms")
    answered = Counter()
    for s in socks:
        s.settimeout(max(1.0, BODY_TIMEOUT_S + 10 - (time.monotonic() - t0)))
        try:
            head = s.recv(65536)
            answered[head[9:12].decode() or "closed"] += 1
        except OSError:
            answered["no answer"] += 1
        s.close()
    print(f"[stalled bodies] after the {BODY_TIMEOUT_S:g} s body deadline: {dict(answered)}")


def fhir_cases() -> dict[str, bytes]:
    empty = (b'{"resourceType":"Bundle","type":"collection","entry":['
             + b",".join([b"{}"] * 2_700_000) + b"]}")
    many = example_bundle()
    lean = {"resource": {"resourceType": "Observation", "status": "final", "code": {
        "coding": [{"system": "http://loinc.org", "code": "8867-4"}]},
        "effectiveDateTime": "2026-01-15T09:00:00Z", "valueQuantity": {"value": 80}}}
    many["entry"] += [copy.deepcopy(lean) for _ in range(26_322)]
    deep = example_bundle()
    ext: dict[str, Any] = {"url": "http://example.org/x", "valueString": "leaf"}
    for _ in range(300):
        ext = {"url": "http://example.org/x", "extension": [ext]}
    deep["entry"][0]["resource"]["extension"] = [ext]
    digits = example_bundle()
    q = next(e["resource"] for e in digits["entry"] if "valueQuantity" in e["resource"])
    q["valueQuantity"]["value"] = int("9" * 309)
    return {"2.7 M empty entries": empty, "26,322 more Observations": dumps(many),
            "extensions 300 deep": dumps(deep), "309-digit value": dumps(digits),
            "valid stay (reference)": dumps(example_bundle())}


async def fhir_limits(srv: Server) -> None:
    for name, body in fhir_cases().items():
        conn = await Conn.open(srv.port)
        cpu0, t0 = srv.cpu_seconds(), time.perf_counter()
        status, answer = await conn.send(post("/fhir/predict/mortality", body))
        wall = time.perf_counter() - t0
        await asyncio.sleep(0.2)  # let /proc catch up with the last tick
        cpu = srv.cpu_seconds() - cpu0
        conn.close()
        rule = ""
        if status != 200:
            rule = json.loads(answer)["detail"][0]["rule"]
        print(f"[fhir limits] {name} ({len(body) / 1e6:.1f} MB): {status} {rule}; server CPU "
              f"{cpu * 1e3:.0f} ms (clock ticks of 10 ms), wall {wall * 1e3:.0f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stalled", type=int, default=64)
    ap.add_argument("--polite", type=int, default=200)
    args = ap.parse_args()
    load = loadavg()
    models, which = model_dir()
    print(f"models: {which}; load average before: {load}")
    stays = default_model_stays("mortality", 8, models, real=False)[0]
    with server(models, body_timeout_s=BODY_TIMEOUT_S) as srv:
        stalled_bodies(srv, args.stalled, args.polite, stays)
        asyncio.run(fhir_limits(srv))
    print(f"load average after: {loadavg()}")


if __name__ == "__main__":
    main()
