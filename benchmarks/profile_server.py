"""Where a loaded server's time goes: `scehr serve` under cProfile, 64 clients, one stay each.

    .venv/bin/python benchmarks/profile_server.py [--batch-size 32] [--seconds 6]

Start-up and shutdown are taken out by profiling a second server that serves nothing and
subtracting its figures function by function. cProfile sees the main thread only, i.e. the
event loop (HTTP, FastAPI, pydantic, ingest, read-outs, serialization, the batcher); ORT runs
in a worker thread and is read from the server's /metrics instead. cProfile slows pure-Python
code more than C code, so the shares are a guide, not a measurement: the figures that count
are in bench_batcher.py. Only prints.
"""

from __future__ import annotations

import argparse
import asyncio
import pstats
import tempfile
import time
from pathlib import Path

from bench_batcher import load, scrape
from common import dumps, loadavg, metric_sums, model_dir, server
from payloads import default_model_stays

# Which part of the stack a function belongs to: the first group with a piece of its file path
# (for C built-ins, of its name) wins.
GROUPS = [
    ("ingest + tensorize (schemas/)", ("schemas/ingest", "schemas/tensorize", "schemas/featureset",
                                       "schemas/normalize", "schemas/variables")),
    ("pydantic (request validation, response models and JSON)", ("pydantic",)),
    ("json.loads of the body", ("json/",)),
    ("sync dependencies: thread-pool hand-offs (anyio, locks)", ("anyio", "threading",
                                                                 "concurrent/futures",
                                                                 "_thread", "queue.py")),
    ("HTTP server (uvicorn, httptools)", ("uvicorn", "h11", "httptools")),
    ("FastAPI / Starlette routing, dependencies, middleware", ("fastapi", "starlette")),
    ("service/ (route, read-outs, batcher, metrics, middleware)", ("service/", "uuid", "urandom")),
    ("prometheus_client", ("prometheus",)),
    ("numpy (read-outs, tensorize)", ("numpy",)),
    ("asyncio event loop + sockets", ("asyncio", "selectors", "socket", "select")),
]


def group(file: str, name: str) -> str:
    text = name if file == "~" else file
    for label, keys in GROUPS:
        if any(k in text for k in keys):
            return label
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--task", default="mortality")
    args = ap.parse_args()
    print(f"load average before: {loadavg()}")
    models, which = model_dir()
    stays, what = default_model_stays(args.task, 256, models)
    bodies = [dumps(s) for s in stays]
    path = f"/predict/{args.task}?explain=basic"  # the 1.0 default: no occlusion rows
    tmp = Path(tempfile.mkdtemp(prefix="scehr-profile-"))
    out, idle = tmp / "server.prof", tmp / "idle.prof"
    with server(models, profile=idle, max_batch_size=args.batch_size, max_queue_size=1024):
        pass
    with server(models, profile=out, max_batch_size=args.batch_size,
                max_queue_size=1024) as srv:
        warm = asyncio.run(load(srv.port, bodies, args.clients, 1.0, path))[0]
        before = asyncio.run(scrape(srv.port))
        lat, _, wall, _ = asyncio.run(load(srv.port, bodies, args.clients, args.seconds, path))
        after = asyncio.run(scrape(srv.port))
    for _ in range(100):  # the profiles are written as the servers exit
        if out.exists() and idle.exists():
            break
        time.sleep(0.1)
    n = len(lat)
    ort = (metric_sums(after, "scehr_compute_seconds", args.task)[0]
           - metric_sums(before, "scehr_compute_seconds", args.task)[0])
    print(f"models: {which}; task {args.task}; {what}; max batch {args.batch_size}; {args.clients} "
          f"clients x {args.seconds:g} s under cProfile: {n / wall:.0f} req/s")
    stats = pstats.Stats(str(out)).stats  # type: ignore[attr-defined]
    base = pstats.Stats(str(idle)).stats  # type: ignore[attr-defined]
    self_time = {k: v[2] - (base[k][2] if k in base else 0.0) for k, v in stats.items()}
    own: dict[str, float] = {}
    for (file, _, name), t in self_time.items():
        g = group(file, name)
        own[g] = own.get(g, 0.0) + t
    # Per-request figures divide by every request served, the 1 s warm-up load included.
    served = n + len(warm)
    total = sum(own.values())
    print(f"event-loop thread, self time by part of the stack, minus an idle server's: "
          f"{total / served * 1e3:.2f} ms per request ({served} requests):")
    for name, t in sorted(own.items(), key=lambda kv: -kv[1]):
        print(f"    {name:58s} {t / served * 1e3:6.2f} ms  {t / total:6.1%}")
    print(f"ORT in its worker thread (from /metrics, load only): "
          f"{ort / n * 1e3:.2f} ms per request")
    print("top functions by self time (ms per request):")
    for (file, line, name), t in sorted(self_time.items(), key=lambda kv: -kv[1])[:10]:
        print(f"    {t / served * 1e3:6.3f}  {name} ({Path(file).name}:{line})")
    print(f"profiles: {out}, {idle} (open with python -m pstats)")


if __name__ == "__main__":
    main()
