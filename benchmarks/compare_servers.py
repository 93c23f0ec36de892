"""scehr against what users would write instead, same model, same real payloads, same client.

    .venv/bin/python benchmarks/compare_servers.py [--task mortality] [--reps 3] [--seconds 6]
        [--clients 64] [--single 200] [--stays 500] [--skip litserve]

Servers, each started fresh per repetition (repetitions interleave the servers, so a change in
the machine's load touches them alike):
  scehr 1 worker        `scehr serve --workers 1` (micro-batcher on, the defaults)
  scehr N workers       `scehr serve` with its default worker count (one per available core)
  scehr N, batch 1      the same with SCEHR_MAX_BATCH_SIZE=1 (batcher off): what batching adds
  plain FastAPI         benchmarks/alternatives/plain_fastapi.py: one ORT run per request
  LitServe              benchmarks/alternatives/litserve_app.py: dynamic batching (if installed)
All of them run the same preprocessing and read-outs (service.pipeline) at explain=basic.

Per server: single-client p50 (sequential requests on one keep-alive connection), the p50 of
its health probe the same way (a GET without model work: that server's HTTP floor),
throughput with `--clients` concurrent clients (keep-alive, `--seconds` after a 1 s warm-up),
and the cores the server's processes used meanwhile (their CPU seconds / wall seconds, from
/proc).
Also the floor: raw `session.run` at batch 1, in-process (1 intra-op thread, and all cores).
Prints min and median over the repetitions, ratios, and the largest difference between the
servers' risks for the same stays (they must agree; the script exits 1 beyond 1e-6). Figures
are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from bench_batcher import load
from common import (
    REPO,
    Conn,
    Server,
    dumps,
    free_port,
    loadavg,
    model_dir,
    pct,
    post,
    server,
    tree_cpu_seconds,
    wait_until_healthy,
)
from payloads import default_model_stays

from schemas.payloads import StayPayload
from service.pipeline import prepare
from service.registry import load_model, read_index, resolve
from service.settings import Settings, available_cores

TOL = 1e-6


#: `scehr` from another checkout (argv[1]) rather than this one's editable install: how
#: `--scehr-source` measures an older commit with the same client in the same run.
_FROM_SOURCE = """import sys
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f)]
sys.path.insert(0, sys.argv[1])
from scehr_cli import main
sys.exit(main(sys.argv[2:]))
"""


@contextmanager
def process_server(cmd: list[str], health: str, env: dict[str, str] | None = None,
                   cwd: Path = REPO) -> Iterator[Server]:
    """A server command on a free port (`{port}` in cmd) until `health` answers 200."""
    port = free_port()
    log = open(tempfile.mkstemp(prefix="scehr-compare-", suffix=".log")[1], "w")  # noqa: SIM115
    proc = subprocess.Popen([c.format(port=port) for c in cmd], stdout=log, stderr=log,
                            cwd=cwd, start_new_session=True, env=env)
    try:
        wait_until_healthy(proc, port, health, log.name, timeout_s=120, poll_s=0.2, what=cmd[1])
        yield Server(port, proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # its own session: LitServe's workers too
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


async def sequential(port: int, raws: list[bytes], n: int) -> list[float]:
    """Latency of `n` requests sent one after another on one keep-alive connection (cycling
    through `raws`, after 20 of them as warm-up); raises on any answer but 200."""
    conn = await Conn.open(port)
    for r in raws[:20]:
        await conn.send(r)
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        status, reply = await conn.send(raws[i % len(raws)])
        lat.append(time.perf_counter() - t0)
        if status != 200:
            raise RuntimeError(f"status {status}: {reply[:300]!r}")
    conn.close()
    return lat


async def single_client(port: int, bodies: list[bytes], path: str, n: int) -> list[float]:
    return await sequential(port, [post(path, b) for b in bodies], n)


def get(path: str) -> bytes:
    """A GET without model work (a health probe): its latency is the server's HTTP floor."""
    return f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode()


def risks(reply: bytes) -> list[float]:
    return [c["risk"] for c in json.loads(reply)["results"]]


def measure(srv: Server, bodies: list[bytes], path: str, health: str,
            args: argparse.Namespace) -> dict[str, Any]:
    lat1 = asyncio.run(single_client(srv.port, bodies, path, args.single))
    probe = asyncio.run(sequential(srv.port, [get(health)], args.single))
    asyncio.run(load(srv.port, bodies, args.clients, 1.0, path))  # warm-up under load
    cpu0 = tree_cpu_seconds(srv.pid)
    lat, errors, wall, replies = asyncio.run(load(srv.port, bodies, args.clients,
                                                  args.seconds, path))
    cores = (tree_cpu_seconds(srv.pid) - cpu0) / wall
    return {"p50": pct(lat1, 50) * 1e3, "probe": pct(probe, 50) * 1e3, "rps": len(lat) / wall,
            "p99": pct(lat, 99) * 1e3, "cores": cores, "errors": errors,
            "risks": {i: risks(r) for i, r in replies.items()}}


def raw_ort(models: Path, task: str, stays: list[dict], threads: int) -> float:
    """Median ms of one `session.run` at batch 1 over the stays (best of 3 passes)."""
    m = load_model(resolve(models, read_index(models), task), task,
                   Settings(model_dir=models, device="cpu", intra_op_threads=threads))
    inputs = [prepare(m.spec, [StayPayload.model_validate(s)]).inputs for s in stays[:200]]
    best = np.inf
    for _ in range(3):
        ts = []
        for x in inputs:
            t0 = time.perf_counter()
            m.run(x)
            ts.append(time.perf_counter() - t0)
        best = min(best, float(np.median(ts)))
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="mortality")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--single", type=int, default=200, help="sequential requests for p50")
    ap.add_argument("--stays", type=int, default=500)
    ap.add_argument("--skip", nargs="*", default=[], help="server keys to leave out: "
                    "scehr-1, scehr-n, scehr-n-b1, fastapi, litserve")
    ap.add_argument("--scehr-source", type=Path, action="append", default=[],
                    help="also serve scehr (1 and N workers) from this checkout, e.g. an "
                    "older commit unpacked with `git archive`, for before/after figures")
    args = ap.parse_args()
    load_before = loadavg()
    models, which = model_dir()
    stays, what = default_model_stays(args.task, args.stays, models)
    bodies = [dumps(s) for s in stays]
    n = available_cores()
    py = sys.executable
    alt = REPO / "benchmarks" / "alternatives"
    common = ["--port", "{port}", "--task", args.task, "--model-dir", str(models)]
    scehr_path = f"/predict/{args.task}?explain=basic"
    # key -> (label, start, predict path, health path: the server's HTTP floor)
    servers: dict[str, tuple[str, Callable[[], AbstractContextManager[Server]], str, str]] = {
        "scehr-1": ("scehr, 1 worker", lambda: server(models, workers=1), scehr_path, "/livez"),
        "scehr-n": (f"scehr, {n} workers (default)", lambda: server(models, workers=n),
                    scehr_path, "/livez"),
        "scehr-n-b1": (f"scehr, {n} workers, batch 1", lambda: server(
            models, workers=n, max_batch_size=1), scehr_path, "/livez"),
        "fastapi": ("plain FastAPI + ORT", lambda: process_server(
            [py, str(alt / "plain_fastapi.py"), *common], "/health"), "/predict", "/health"),
        "litserve": ("LitServe, dynamic batching", lambda: process_server(
            [py, str(alt / "litserve_app.py"), *common], "/health"), "/predict", "/health"),
    }
    for src in args.scehr_source:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCEHR_")}
        base = [py, "-c", _FROM_SOURCE, str(src.resolve()), "serve", "--port", "{port}",
                "--model-dir", str(models), "--device", "cpu", "--workers"]
        for w in sorted({1, n}):
            servers[f"{src.name}-{w}"] = (
                f"scehr from {src.name}, {w} worker{'s' if w > 1 else ''}",
                lambda base=base, w=w, env=env, src=src: process_server(
                    [*base, str(w)], "/readyz", env, src.resolve()), scehr_path, "/livez")
    try:
        import litserve  # noqa: F401
    except ImportError:
        print("litserve is not installed (pip install -e '.[bench]'): LitServe left out")
        args.skip.append("litserve")
    keys = [k for k in servers if k not in args.skip]
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in keys}
    for rep in range(args.reps):
        for k in keys:
            label, start, path, health = servers[k]
            with start() as srv:
                r = measure(srv, bodies, path, health, args)
            results[k].append(r)
            print(f"rep {rep + 1}/{args.reps} {label:32s} p50 {r['p50']:6.2f} ms  "
                  f"{r['rps']:6.0f} req/s  p99 {r['p99']:7.1f} ms  cores {r['cores']:.2f}"
                  + (f"  errors {r['errors']}" if r["errors"] else ""), flush=True)
    floor1 = raw_ort(models, args.task, stays, 1)
    floor_all = raw_ort(models, args.task, stays, n)
    floor = min(floor1, floor_all)

    # every server of this checkout must give scehr's risks for the same stays; an older
    # checkout (--scehr-source) may differ where its ingest rules did, so it is only reported
    ref = results[keys[0]][0]["risks"]
    older = {f"{src.name}-{w}" for src in args.scehr_source for w in (1, n)}

    def largest_difference(ks: list[str]) -> float:
        return max((float(np.abs(np.subtract(v, ref[i])).max())
                    for k in ks for r in results[k] for i, v in r["risks"].items() if i in ref),
                   default=0.0)

    worst = largest_difference([k for k in keys if k not in older])
    older_diff = largest_difference([k for k in keys if k in older])

    def mm(k: str, f: str, fmt: str) -> str:
        v = [r[f] for r in results[k]]
        return f"{format(min(v), fmt)}–{format(float(np.median(v)), fmt)}"

    def med(k: str, f: str) -> float:
        return float(np.median([r[f] for r in results[k]]))

    print()
    print(f"models: {which}; task {args.task}; payloads: {what} "
          f"({np.mean([len(b) for b in bodies]) / 1e3:.1f} kB mean); {n} available cores; "
          f"load average before: {load_before}, after: {loadavg()}")
    print(f"min–median of {args.reps} repetitions; {args.clients} clients for "
          f"{args.seconds:g} s; p50 over {args.single} sequential requests")
    print()
    print(f"| server | single-client p50 (ms) | health probe p50 (ms) | {args.clients} "
          f"clients req/s | {args.clients}-client p99 (ms) | cores used |")
    print("|---|---|---|---|---|---|")
    for k in keys:
        print(f"| {servers[k][0]} | {mm(k, 'p50', '.2f')} | {mm(k, 'probe', '.2f')} | "
              f"{mm(k, 'rps', '.0f')} | {mm(k, 'p99', '.0f')} | {mm(k, 'cores', '.2f')} |")
    print(f"| raw `session.run`, batch 1 (the floor) | {floor:.2f} (1 thread {floor1:.2f}, "
          f"{n} threads {floor_all:.2f}) | — | — | — | — |")
    print()
    print("ratios of medians (targets: p50 <= 3x the floor and below plain FastAPI's; "
          f"{args.clients}-client req/s >= 2x plain FastAPI and LitServe; batcher >= 1.5x "
          "batch 1):")
    print()
    others = [k for k in ("fastapi", "litserve") if k in keys]
    print("| server | p50 / floor | " + "".join(f"p50 / {servers[o][0]} | " for o in others)
          + "".join(f"req/s / {servers[o][0]} | " for o in others) + "CPU ms per request |")
    print("|---|---|" + "---|" * (2 * len(others) + 1))
    for k in keys:
        cells = [f"{med(k, 'p50') / floor:.2f}x"]
        cells += [f"{med(k, 'p50') / med(o, 'p50'):.2f}x" for o in others]
        cells += [f"{med(k, 'rps') / med(o, 'rps'):.2f}x" for o in others]
        cells.append(f"{med(k, 'cores') / med(k, 'rps') * 1e3:.2f}")
        print(f"| {servers[k][0]} | " + " | ".join(cells) + " |")
    print()
    if "scehr-n" in keys and "scehr-1" in keys:
        print(f"{args.clients}-client req/s, {n} workers / 1 worker: "
              f"{med('scehr-n', 'rps') / med('scehr-1', 'rps'):.2f}x")
    if "scehr-n" in keys and "scehr-n-b1" in keys:
        print(f"{args.clients}-client req/s, batcher on / batch 1 ({n} workers): "
              f"{med('scehr-n', 'rps') / med('scehr-n-b1', 'rps'):.2f}x")
    print(f"largest risk difference between servers for the same stay: {worst:.2e} "
          f"(tolerance {TOL:g})")
    if older & set(keys):
        print(f"largest risk difference of the older checkout(s): {older_diff:.2e} (not "
              "checked: an older checkout scores differently wherever the ingest rules changed)")
    if worst > TOL:
        sys.exit(1)


if __name__ == "__main__":
    main()
