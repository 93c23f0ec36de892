"""Served single-stay latency of two model versions side by side, in one server.

    .venv/bin/python benchmarks/served_versions.py [--task mortality] [--versions 1.3.1 1.2.2]
        [--stays 200] [--passes 3]

One `scehr serve --workers 1` serves both versions (`SCEHR_VERSIONS`); one keep-alive client
sends the same real test stays to `?version=A` and `?version=B` in turn, request by request,
at `explain=top` and at `explain=basic` (the default request), so both versions see the same
machine state. Prints the p50 and p95 per version and the ratio of the p50s, with the load
average before and after. Stays a version abstains on are left out for both. Timings are only
printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from common import Conn, dumps, loadavg, model_dir, pct, post, server
from payloads import real_stays


async def run(port: int, task: str, versions: list[str], bodies: list[bytes], passes: int
              ) -> dict[tuple[str, str], list[float]]:
    conn = await Conn.open(port)
    lat: dict[tuple[str, str], list[float]] = {}
    try:
        for explain in ("top", "basic"):
            paths = {v: f"/predict/{task}?version={v}&explain={explain}" for v in versions}
            for b in bodies[:20]:  # warm-up
                for v in versions:
                    await conn.send(post(paths[v], b))
            for _ in range(passes):
                for b in bodies:
                    for v in versions:
                        t0 = time.perf_counter()
                        status, _ = await conn.send(post(paths[v], b))
                        lat.setdefault((explain, v), []).append(time.perf_counter() - t0)
                        if status != 200:
                            raise SystemExit(f"{v}: HTTP {status}")
    finally:
        conn.close()
    return lat


async def scored_by_all(port: int, task: str, versions: list[str], stays: list[dict]
                        ) -> list[bytes]:
    """The stays every version scores (none abstains on them)."""
    conn = await Conn.open(port)
    keep = []
    try:
        for s in stays:
            b = dumps(s)
            ok = True
            for v in versions:
                status, body = await conn.send(post(f"/predict/{task}?version={v}&explain=basic",
                                                    b))
                ok = ok and status == 200 and json.loads(body)["status"] == "scored"
            if ok:
                keep.append(b)
    finally:
        conn.close()
    return keep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", default="mortality")
    ap.add_argument("--versions", nargs=2, default=["1.3.1", "1.2.2"])
    ap.add_argument("--stays", type=int, default=200)
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args()
    before = loadavg()
    models, which = model_dir()
    found = real_stays(args.task, args.stays, models)
    if found is None:
        raise SystemExit("needs the converted test stays under data/ (benchmarks/payloads.py)")
    stays, what = found
    versions = list(args.versions)
    with server(models, workers=1, versions=f"{args.task}={','.join(versions)}") as srv:
        bodies = asyncio.run(scored_by_all(srv.port, args.task, versions, stays))
        lat = asyncio.run(run(srv.port, args.task, versions, bodies, args.passes))
    print(f"models: {which}; {what}, {len(bodies)} scored by both; {args.passes} passes; "
          f"load average before {before}, after {loadavg()}")
    print("| request | version | p50 ms | p95 ms | p50 ÷ second version's |")
    print("|---|---|---|---|---|")
    for explain in ("top", "basic"):
        ref = pct(lat[(explain, versions[1])], 50)
        for v in versions:
            xs = lat[(explain, v)]
            print(f"| explain={explain} | {v} | {pct(xs, 50) * 1e3:.2f} | "
                  f"{pct(xs, 95) * 1e3:.2f} | {pct(xs, 50) / ref:.2f} |")


if __name__ == "__main__":
    main()
