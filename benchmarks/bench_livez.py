"""/livez latency while the server does its heaviest valid work.

    .venv/bin/python benchmarks/bench_livez.py [--interface json|v2|fhir|all] [--seconds 20]
        [--stays 256] [--senders 2] [--observations 2000]

The heaviest valid request of each interface, sent back to back by `--senders` clients:
`json`, `--stays`-stay phenotypes batches with `explain=full` (the largest batch the default
settings accept, with occlusion: one ORT row per observed channel per stay); `v2`, the same
stays as one Open Inference `stay` BYTES tensor; `fhir`, one mortality stay as a FHIR Bundle of
`--observations` Observations. A 503 (admission: the model is full) waits 1 s, the default
Retry-After, and is counted. A scraper reads /metrics every 0.5 s, and a probe calls /livez
every 50 ms on its own connection. Prints the probe's p50/p99/max beside the target (p99 <
100 ms; a liveness probe with a 1 s timeout must never miss) and the requests done. Timings are
printed, never asserted; on a shared machine they are inflated by other load (the load average
before and after is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter

from common import Conn, dumps, full_stay, loadavg, model_dir, pct, post, server
from payloads import default_model_stays

from tests.service.fhir_writer import EXAMPLE_ADMISSION, bundle, groups_from_stay

LIVEZ = b"GET /livez HTTP/1.1\r\nHost: b\r\n\r\n"
METRICS = b"GET /metrics HTTP/1.1\r\nHost: b\r\n\r\n"


async def run(port: int, seconds: float, path: str, body: bytes, senders: int
              ) -> dict[str, list]:
    stop = time.perf_counter() + seconds
    probe: list[float] = []
    batches: list[float] = []
    statuses: list[int] = []

    async def sender() -> None:
        conn = await Conn.open(port)
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            status, _ = await conn.send(post(path, body))
            statuses.append(status)
            if status == 503:
                await asyncio.sleep(1.0)
                continue
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


def fhir_bundle(observations: int) -> bytes:
    """One mortality stay as a FHIR Bundle of `observations` Observations (full synthetic
    stays' observations, 48 h each, shifted so the times stay distinct)."""
    groups: list = []
    seed = 0
    while len(groups) < observations:
        stay = full_stay(seed)
        stay["observations"] = [dict(o, time=o["time"] + 0.001 * seed)
                                for o in stay["observations"]]
        groups += groups_from_stay(stay)
        seed += 1
    return dumps(bundle(groups[:observations], admission=EXAMPLE_ADMISSION))


def request(interface: str, args: argparse.Namespace, models: object) -> tuple[str, bytes, str]:
    """(path, body, what it is) of the heaviest valid request of `interface`."""
    if interface == "fhir":
        body = fhir_bundle(args.observations)
        return ("/fhir/predict/mortality", body, f"FHIR Bundles of {args.observations} "
                f"Observations ({len(body) / 1e6:.1f} MB each)")
    stays = [dict(s, end_hours=float(args.hours)) for s in default_model_stays(
        "phenotypes", args.stays, models, args.hours, real=False)[0]]
    if interface == "v2":
        body = dumps({"inputs": [{"name": "stay", "shape": [len(stays)], "datatype": "BYTES",
                                  "data": [json.dumps(s) for s in stays]}]})
        return ("/v2/models/phenotypes/infer", body, f"V2 infer of {args.stays} phenotypes "
                f"stays ({len(body) / 1e6:.1f} MB each)")
    body = dumps({"stays": stays})
    return ("/predict/phenotypes/batch?explain=full", body, f"{args.stays}-stay phenotypes "
            f"explain=full batches ({len(body) / 1e6:.1f} MB each)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--interface", choices=["json", "v2", "fhir", "all"], default="json")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--stays", type=int, default=256)
    ap.add_argument("--senders", type=int, default=2)
    ap.add_argument("--hours", type=int, default=48)
    ap.add_argument("--observations", type=int, default=2000)
    ap.add_argument("--gil-switch-ms", type=float, default=None,
                    help="SCEHR_GIL_SWITCH_MS of the server (default: the service's)")
    args = ap.parse_args()
    settings = {} if args.gil_switch_ms is None else {"gil_switch_ms": args.gil_switch_ms}
    models, which = model_dir()
    print(f"models: {which}")
    for interface in (["json", "v2", "fhir"] if args.interface == "all" else [args.interface]):
        path, body, what = request(interface, args, models)
        load = loadavg()
        with server(models, **settings) as srv:
            r = asyncio.run(run(srv.port, args.seconds, path, body, args.senders))
        probe, done = r["probe"], r["batches"]
        bad = Counter(s for s in r["statuses"] if s != 200)
        print(f"[{interface}] {args.senders} senders of {what} + /metrics every 0.5 s, "
              f"{args.seconds:.0f} s {settings or ''}; load average before: {load}, after: "
              f"{loadavg()}")
        print(f"[{interface}] requests done: {len(done)} (median {pct(done, 50):.2f} s each); "
              f"non-200 answers: {sum(bad.values())} {dict(bad) or ''}")
        p99 = pct(probe, 99) * 1e3
        print(f"[{interface}] /livez ({len(probe)} probes): p50 {pct(probe, 50) * 1e3:.1f} ms  "
              f"p99 {p99:.1f} ms (target < 100 ms: {'met' if p99 < 100 else 'missed'})  "
              f"max {max(probe) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
