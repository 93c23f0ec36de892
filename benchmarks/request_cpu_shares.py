"""Where a served request's CPU goes, stage by stage: one `scehr serve --workers 1` sampled by
py-spy under 64 keep-alive connections, then under sequential requests.

    .venv/bin/python benchmarks/request_cpu_shares.py [--seconds 8] [--clients 64] [--stays 500]
        [--explain basic] [--compare offload_bytes=32768]

Bodies: real test stays of the default mortality model's data (`payloads.default_model_stays`)
sent as LOINC-coded long form (`observations`, each variable under its main LOINC code from
`scehr.schemas.variables`, about 25 kB each), as a hospital's system would send them.
py-spy (`pip install py-spy`, the `bench` extra) samples every thread of the server at 250 Hz
without stopping it (`--nonblocking`); a sample whose innermost frame is a thread waiting
(a worker thread's queue, the loop's `epoll`) is idle and left out. Each busy sample counts
for the stage of its innermost frame that `STAGES` names (walking from the innermost frame
out), so the shares add up to 100 % of the sampled CPU of every thread, ORT's included.
Sampling is wall-clock per running thread: a thread waiting for the GIL is sampled where it
waits, so under load the hand-off stages absorb some GIL contention; the CPU ms per request
(from /proc) and the `--compare` runs (the same server with one setting changed, e.g. the old
`offload_bytes=32768`, alternated with the default twice) are the figures to quote. Only
prints: shares, req/s, CPU ms per request, the sequential p50, the load average before and
after.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench_batcher import load
from common import Conn, dumps, loadavg, model_dir, pct, post, server
from payloads import default_model_stays

#: Stage of a sample: the first rule, from the innermost frame out, whose key is in the frame.
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("logging (access and audit lines)", ("logging/", "service/logs.py")),
    ("metrics (prometheus_client)", ("prometheus_client",)),
    ("ORT run", ("onnxruntime/",)),
    ("ORT wrapper (row-block padding)", ("service/registry.py",)),
    ("batcher (queue, hand-off)", ("service/batcher.py",)),
    ("body parse + validation (pydantic)", ("parse_stay",)),
    ("ingest + tensorize", ("Scorer._prepare", "service/pipeline.py")),
    ("read-outs: explanations", ("service/explain.py",)),
    ("read-outs: calibration, intervals, alerts", ("service/model.py", "service/operating.py",
                                                   "schemas/uncertainty.py")),
    ("read-outs: response objects", ("service/responses.py",)),
    ("monitoring", ("service/monitoring.py",)),
    ("audit hash", ("schemas/audit.py",)),
    ("scorer (rest)", ("service/scorer.py",)),
    ("response serialisation", ("model_dump_json", ".encode (service/interfaces")),
    ("thread hand-offs (anyio, executor)", ("anyio", "concurrent/futures",
                                            "starlette/concurrency", "threading.py",
                                            "queue.py")),
    ("request context middleware", ("service/middleware.py", "uuid")),
    ("load shedding middleware", ("service/load_shedding.py",)),
    ("endpoint (options, model handle)", ("service/interfaces", "service/deps.py",
                                          "service/query_route.py")),
    ("FastAPI / Starlette", ("fastapi", "starlette")),
    ("HTTP (uvicorn, httptools)", ("uvicorn", "httptools", "h11")),
    ("asyncio loop, sockets", ("asyncio", "selectors", "socket")),
]
#: Innermost frames of a waiting thread: not CPU.
IDLE = ("Condition.wait", "Queue.get (queue.py", "_worker (concurrent/futures/thread.py",
        "WorkerThread.run (anyio", "select (selectors", "Runner.run (asyncio/runners.py")


def stage(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, keys in STAGES:
            if any(k in frame for k in keys):
                return name
    return "other"


def shares(raw: Path) -> tuple[Counter[str], int]:
    """Busy samples per stage of a py-spy raw file (`thread;frame;...;frame count` lines)."""
    busy: Counter[str] = Counter()
    idle = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")[1:]
        if not frames or frames[-1].startswith(IDLE):
            idle += int(n)
        else:
            busy[stage(frames)] += int(n)
    return busy, idle


def spy(pid: int, out: Path, seconds: float) -> subprocess.Popen[bytes]:
    exe = Path(sys.executable).parent / "py-spy"
    if not exe.is_file():
        sys.exit(f"py-spy is not installed next to {sys.executable}: "
                 "pip install -e '.[bench]' (or pip install py-spy)")
    return subprocess.Popen([str(exe), "record", "--pid", str(pid), "--rate", "250",
                             "--format", "raw", "-o", str(out), "--duration",
                             str(max(1, round(seconds))), "--threads", "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def sequential(port: int, bodies: list[bytes], path: str, seconds: float) -> list[float]:
    conn = await Conn.open(port)
    lat: list[float] = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        t0 = time.perf_counter()
        status, _ = await conn.send(post(path, bodies[len(lat) % len(bodies)]))
        if status == 200:
            lat.append(time.perf_counter() - t0)
    conn.close()
    return lat


def under_load(models: Path, bodies: list[bytes], path: str, args: argparse.Namespace,
               settings: dict[str, str], profile: Path | None) -> dict[str, Any]:
    """req/s and CPU ms per request at `args.clients` connections, then the sequential p50;
    with `profile`, py-spy files `<profile>_load.txt` and `<profile>_seq.txt`."""
    res: dict[str, Any] = {}
    with server(models, max_queue_size=1024, **settings) as srv:
        asyncio.run(load(srv.port, bodies, args.clients, 1.5, path))  # warm-up
        p = spy(srv.pid, Path(f"{profile}_load.txt"), args.seconds) if profile else None
        c0 = srv.cpu_seconds()
        lat, errors, wall, _ = asyncio.run(load(srv.port, bodies, args.clients, args.seconds,
                                                path))
        res["load"] = (len(lat) / wall, (srv.cpu_seconds() - c0) / len(lat) * 1e3, errors)
        if p is not None:
            p.wait()
        p = spy(srv.pid, Path(f"{profile}_seq.txt"), args.seconds) if profile else None
        c0 = srv.cpu_seconds()
        lat = asyncio.run(sequential(srv.port, bodies, path, args.seconds))
        res["seq"] = (pct(lat, 50) * 1e3, (srv.cpu_seconds() - c0) / len(lat) * 1e3)
        if p is not None:
            p.wait()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--stays", type=int, default=500)
    ap.add_argument("--explain", default="basic")
    ap.add_argument("--compare", default=None, help="NAME=VALUE: a setting (SCEHR_NAME) "
                    "whose server is alternated with the default one, twice each")
    args = ap.parse_args()
    print(f"load average before: {loadavg()}")
    models, which = model_dir()
    stays, what = default_model_stays("mortality", args.stays, models, form="loinc")
    bodies = [dumps(s) for s in stays]
    sizes = sorted(len(b) for b in bodies)
    path = f"/predict/mortality?explain={args.explain}"
    print(f"models: {which}; {what} (median {sizes[len(sizes) // 2]} bytes); POST {path}; "
          "one worker")
    tmp = Path(tempfile.mkdtemp(prefix="scehr-shares-"))
    res = under_load(models, bodies, path, args, {}, tmp / "default")
    rps, cpu, errors = res["load"]
    print(f"{args.clients} connections x {args.seconds:g} s under py-spy: {rps:.0f} req/s, "
          f"{cpu:.2f} CPU ms per request ({errors} not 200); sequential: p50 "
          f"{res['seq'][0]:.2f} ms, {res['seq'][1]:.2f} CPU ms per request")
    for kind, label in (("load", f"{args.clients} connections"), ("seq", "sequential")):
        busy, idle = shares(tmp / f"default_{kind}.txt")
        total = sum(busy.values()) or 1
        print(f"\n| stage ({label}; {total} busy samples, {idle} idle left out) | share |")
        print("|---|---|")
        for name, n in busy.most_common():
            print(f"| {name} | {n / total:.1%} |")
    if args.compare:
        name, value = args.compare.split("=", 1)
        runs: dict[str, list[dict[str, Any]]] = {"default": [], args.compare: []}
        for _ in range(2):
            runs["default"].append(under_load(models, bodies, path, args, {}, None))
            runs[args.compare].append(under_load(models, bodies, path, args, {name: value},
                                                 None))
        print(f"\n| server (not profiled) | req/s at {args.clients} connections | CPU ms per "
              "request | sequential p50 ms |")
        print("|---|---|---|---|")
        for label, rs in runs.items():
            print(f"| {label} | " + " | ".join(
                ", ".join(f(r) for r in rs) for f in (
                    lambda r: f"{r['load'][0]:.0f}", lambda r: f"{r['load'][1]:.2f}",
                    lambda r: f"{r['seq'][0]:.2f}")) + " |")
    print(f"\nload average after: {loadavg()}; py-spy files in {tmp}")


if __name__ == "__main__":
    main()
