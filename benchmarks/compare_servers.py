"""scehr against what a competent user would write instead: same model, same real stays.

    .venv/bin/python benchmarks/compare_servers.py [--task mortality] [--reps 3] [--seconds 4]
        [--connections 64] [--workers 1 2] [--servers ...] [--stays 500] [--max-load 1.5]
        [--payload loinc|wide]

Servers (each started fresh per block; repetitions interleave them, so a drift in the machine
touches all alike), each at every `--workers` count (equal process counts side by side):
  scehr-default    `scehr serve`, the request a client sends: `POST /predict/<task>` (its
                   default `explain=basic`: anchors, percentiles, prototypes)
  scehr-top        the same server, `?explain=top`: also the occlusion contributions (one
                   more model row per observed channel)
  fastapi-ort      plain FastAPI + ORT, ORT's default session (benchmarks/alternatives/
                   plain_fastapi.py: validate, tensorize, one run, return only the risk)
  fastapi-tuned    the same app with scehr's ORT session options
  litserve         LitServe 0.2.19 with its defaults (max_batch_size 1, batch_timeout 0.0)
  litserve-tuned   LitServe tuned: max batch 32, 2 ms batch timeout, scehr's session options
A block per server: start it; every stay once on one keep-alive connection (its risks, and the
p50 of those sequential requests); the p50 of its health probe the same way (its HTTP floor);
1 s of warm-up under load, then `--seconds` of `--connections` concurrent keep-alive
connections from the load generator: wrk (one thread) when installed, else this script's
asyncio client. The server's CPU seconds (its process tree, /proc) over the block give CPU ms
per request; the generator's own CPU is reported beside it (it must not saturate the machine),
and so is the CPU every other process used meanwhile (/proc/stat less both: other jobs).
Before each block the 1-minute load average is recorded; if it is >= `--max-load`, the script
waits up to `--settle` seconds for it to fall, else flags the block, and any flagged block
makes the run exit 2 (its table is not valid). Each block prints its req/s and the server's
cores in use. The table gives the medians of `--reps` repetitions and, beside them, the worst
block (lowest req/s) with its cores in use: with `--reps 5`, "in every one of 5 fresh starts"
reads from one row. The stays are the real test stays of the default model's converted data
(synthetic stays without it), sent by default as a client integrating an EHR sends them
(`--payload loinc`: long-form observations named by LOINC code, about 30 kB per stay; `wide`:
the wide form, a third of the size); every server validates and tensorizes either form with
scehr's own code. Only the stays that meet the model's data minimum are sent (below it scehr
abstains: less work than scoring).
Every server's risk for every stay must equal scehr's within 1e-6 (else exit 1). Prints one
markdown table: figures and ratios side by side (ratios against the plain FastAPI app with the
tuned session and against LitServe's defaults, at the same worker count; and against LitServe
at equal working processes: LitServe's one worker is two processes, an API server and an
inference worker, so it pairs with scehr's two). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from bench_batcher import load as python_load
from common import (
    REPO,
    Conn,
    Server,
    dumps,
    free_port,
    model_dir,
    pct,
    post,
    server,
    tree_cpu_seconds,
    wait_until_healthy,
)
from payloads import default_model_stays

from scehr.schemas.payloads import StayPayload
from scehr.service.pipeline import prepare
from scehr.service.registry import load_model, read_index, resolve
from scehr.service.responses import sufficiency
from scehr.service.settings import Settings

TOL = 1e-6
KINDS = ("scehr-default", "scehr-top", "fastapi-ort", "fastapi-tuned", "litserve",
         "litserve-tuned")
#: The rows every other is divided by, at the same worker count.
BASELINES = ("fastapi-tuned", "litserve")


def processes(kind: str, workers: int) -> int:
    """The processes that work on each request: LitServe runs one API server process per
    inference worker process (a request crosses both); scehr and uvicorn apps, one worker
    process each (the supervisor of `--workers N` only watches)."""
    return 2 * workers if kind.startswith("litserve") else workers


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
        os.killpg(proc.pid, signal.SIGTERM)  # its own session: LitServe's and uvicorn's workers
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        # what outlives its parent (LitServe's inference worker kept a core busy into the next
        # server's block): nothing of this server runs after its block
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        log.close()


async def sequential(port: int, raws: list[bytes], n: int) -> tuple[list[float], list[bytes]]:
    """Latency and reply of `n` requests sent one after another on one keep-alive connection
    (cycling through `raws`, after 20 of them as warm-up); raises on any answer but 200."""
    conn = await Conn.open(port)
    for r in raws[:20]:
        await conn.send(r)
    lat, replies = [], []
    for i in range(n):
        t0 = time.perf_counter()
        status, reply = await conn.send(raws[i % len(raws)])
        lat.append(time.perf_counter() - t0)
        if status != 200:
            raise RuntimeError(f"status {status}: {reply[:300]!r}")
        replies.append(reply)
    conn.close()
    return lat, replies


async def single_client(port: int, bodies: list[bytes], path: str, n: int) -> list[float]:
    return (await sequential(port, [post(path, b) for b in bodies], n))[0]


def get(path: str) -> bytes:
    """A GET without model work (a health probe): its latency is the server's HTTP floor."""
    return f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode()


def risks(reply: bytes) -> list[float]:
    """The risk per class, from scehr's Prediction or an alternative's `{"risk": [...]}`."""
    doc = json.loads(reply)
    return doc["risk"] if "risk" in doc else [c["risk"] for c in doc["results"]]


# ---------------------------------------------------------------- load generators

_WRK_SCRIPT = """
local bodies, i = {}, 0
for line in io.lines(os.getenv("COMPARE_BODIES")) do bodies[#bodies + 1] = line end
local requests = {}
init = function(args)
  for k, b in ipairs(bodies) do
    requests[k] = wrk.format("POST", os.getenv("COMPARE_PATH"),
                             {["Content-Type"] = "application/json"}, b)
  end
end
request = function() i = i % #requests + 1; return requests[i] end
done = function(summary, latency, requests)
  io.write(string.format("COMPARE %d %d %d %.1f %.1f\\n", summary.requests, summary.duration,
    summary.errors.status + summary.errors.connect + summary.errors.read +
    summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


@dataclass
class Block:
    """One load block: completed requests, errors, wall seconds, p50/p99 ms, generator CPU s."""

    requests: int
    errors: int
    wall: float
    p50: float
    p99: float
    generator_cpu: float


def wrk_block(port: int, bodies_file: Path, path: str, connections: int,
              seconds: float, script: Path) -> Block:
    env = {**os.environ, "COMPARE_BODIES": str(bodies_file), "COMPARE_PATH": path}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--timeout",
                          "10s", "-s", str(script), f"http://127.0.0.1:{port}"],
                         capture_output=True, text=True, env=env, check=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    m = re.search(r"^COMPARE (\d+) (\d+) (\d+) ([\d.]+) ([\d.]+)$", out, re.M)
    if m is None:
        raise RuntimeError(f"wrk printed no summary:\n{out}")
    n, us, errors, p50, p99 = m.groups()
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return Block(int(n), int(errors), int(us) / 1e6, float(p50) / 1e3, float(p99) / 1e3, cpu)


def python_block(port: int, bodies: list[bytes], path: str, connections: int,
                 seconds: float) -> Block:
    c0 = time.process_time()
    lat, errors, wall, _ = asyncio.run(python_load(port, bodies, connections, seconds, path))
    return Block(len(lat), errors, wall, pct(lat, 50) * 1e3, pct(lat, 99) * 1e3,
                 time.process_time() - c0)


# ---------------------------------------------------------------- servers


@dataclass
class Spec:
    label: str
    start: Callable[[], AbstractContextManager[Server]]
    path: str
    health: str


def specs(models: Path, task: str, workers: int) -> dict[str, Spec]:
    py = sys.executable
    alt = REPO / "benchmarks" / "alternatives"
    common = ["--port", "{port}", "--task", task, "--model-dir", str(models),
              "--workers", str(workers)]
    fastapi = [py, str(alt / "plain_fastapi.py"), *common]
    litserve = [py, str(alt / "litserve_app.py"), *common]
    w = f"{workers} worker{'s' if workers > 1 else ''}"
    return {
        "scehr-default": Spec(f"scehr, default request (explain=basic), {w}",
                              lambda: server(models, workers=workers), f"/predict/{task}",
                              "/livez"),
        "scehr-top": Spec(f"scehr, explain=top, {w}", lambda: server(models, workers=workers),
                          f"/predict/{task}?explain=top", "/livez"),
        "fastapi-ort": Spec(f"plain FastAPI + ORT defaults, {w}", lambda: process_server(
            [*fastapi, "--session", "default"], "/health"), "/predict", "/health"),
        "fastapi-tuned": Spec(f"plain FastAPI + ORT tuned, {w}", lambda: process_server(
            [*fastapi, "--session", "tuned"], "/health"), "/predict", "/health"),
        "litserve": Spec(f"LitServe defaults (no batching), {w}", lambda: process_server(
            [*litserve], "/health"), "/predict", "/health"),
        "litserve-tuned": Spec(f"LitServe tuned (batch 32, 2 ms, ORT tuned), {w}",
                               lambda: process_server([*litserve, "--max-batch-size", "32",
                                                       "--batch-timeout", "0.002",
                                                       "--session", "tuned"], "/health"),
                               "/predict", "/health"),
    }


def settle(max_load: float, wait_s: float) -> float:
    """The 1-minute load average, after waiting up to `wait_s` for it to fall below
    `max_load` (this script's own previous block raises it too)."""
    deadline = time.monotonic() + wait_s
    while os.getloadavg()[0] >= max_load and time.monotonic() < deadline:
        time.sleep(2)
    return os.getloadavg()[0]


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), as the figures depend on it."""
    info = Path("/proc/cpuinfo")
    names = re.findall(r"^model name\s*:\s*(.+)$", info.read_text(), re.M) if info.exists() else []
    return names[0] if names else "CPU model unknown"


def busy_cpu_seconds() -> float:
    """CPU seconds every process on the machine has used (/proc/stat: all but idle, iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def measure(srv: Server, spec: Spec, bodies: list[bytes], args: argparse.Namespace,
            run_block: Callable[[int, str], Block]) -> dict[str, Any]:
    lat1, replies = asyncio.run(sequential(srv.port, [post(spec.path, b) for b in bodies],
                                           len(bodies)))
    probe, _ = asyncio.run(sequential(srv.port, [get(spec.health)], 200))
    asyncio.run(python_load(srv.port, bodies, args.connections, 1.0, spec.path))  # warm-up
    cpu0, busy0 = tree_cpu_seconds(srv.pid), busy_cpu_seconds()
    block = run_block(srv.port, spec.path)
    cpu = tree_cpu_seconds(srv.pid) - cpu0
    others = busy_cpu_seconds() - busy0 - cpu - block.generator_cpu
    return {"p50": pct(lat1, 50) * 1e3, "probe": pct(probe, 50) * 1e3,
            "rps": block.requests / block.wall, "p99": block.p99, "errors": block.errors,
            "cpu_ms": cpu / max(block.requests, 1) * 1e3, "server_cores": cpu / block.wall,
            "generator_cores": block.generator_cpu / block.wall,
            "other_cores": max(others, 0.0) / block.wall,
            "risks": [risks(r) for r in replies]}


def scored_by_scehr(models: Path, task: str, stays: list[dict]) -> list[dict]:
    """The stays scehr gives a risk: those that meet the model's data minimum (below it scehr
    abstains, the alternatives would score them), so every server does the same work."""
    m = load_model(resolve(models, read_index(models), task), task,
                   Settings(model_dir=models, device="cpu", intra_op_threads=1))
    minimum = m.spec.manifest.data_minimum
    keep = []
    for s in stays:
        prep = prepare(m.spec, [StayPayload.model_validate(s)])
        enough = sufficiency(prep.data[0], minimum) if prep.data else None
        if prep.ok and (enough is None or enough["meets_minimum"]):
            keep.append(s)
    return keep


def raw_ort(models: Path, task: str, stays: list[dict]) -> float:
    """Median ms of one `session.run` at batch 1 (scehr's session, 1 thread), best of 3."""
    m = load_model(resolve(models, read_index(models), task), task,
                   Settings(model_dir=models, device="cpu", intra_op_threads=1))
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
    ap.add_argument("--seconds", type=float, default=4.0, help="length of a load block")
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--servers", nargs="+", choices=KINDS, default=list(KINDS))
    ap.add_argument("--stays", type=int, default=500)
    ap.add_argument("--generator", choices=("auto", "wrk", "python"), default="auto")
    ap.add_argument("--max-load", type=float, default=1.5,
                    help="1-minute load average at or above which a block is flagged")
    ap.add_argument("--settle", type=float, default=30.0,
                    help="seconds to wait for the load to fall before each block")
    ap.add_argument("--payload", choices=("loinc", "wide"), default="loinc",
                    help="request form of the real stays: LOINC-coded long-form observations "
                    "(as an EHR interface sends them) or the wide form")
    args = ap.parse_args()
    models, which = model_dir()
    offered, what = default_model_stays(args.task, args.stays, models, form=args.payload)
    stays = scored_by_scehr(models, args.task, offered)
    bodies = [dumps(s) for s in stays]
    use_wrk = args.generator == "wrk" or (args.generator == "auto" and shutil.which("wrk"))
    tmp = Path(tempfile.mkdtemp(prefix="scehr-compare-"))
    (tmp / "bodies.jsonl").write_bytes(b"\n".join(bodies) + b"\n")
    (tmp / "compare.lua").write_text(_WRK_SCRIPT)

    def run_block(port: int, path: str) -> Block:
        if use_wrk:
            return wrk_block(port, tmp / "bodies.jsonl", path, args.connections, args.seconds,
                             tmp / "compare.lua")
        return python_block(port, bodies, path, args.connections, args.seconds)

    print(f"payloads: {what} ({np.mean([len(b) for b in bodies]) / 1e3:.1f} kB mean)",
          flush=True)
    rows = [(k, w) for w in args.workers for k in args.servers]
    try:
        import litserve  # noqa: F401
    except ImportError:
        print("litserve is not installed (pip install -e '.[bench]'): LitServe left out")
        rows = [(k, w) for k, w in rows if not k.startswith("litserve")]
    table = {w: specs(models, args.task, w) for w in args.workers}
    results: dict[tuple[str, int], list[dict[str, Any]]] = {r: [] for r in rows}
    flagged = 0
    t_start = time.monotonic()
    for rep in range(args.reps):
        for k, w in rows:
            spec = table[w][k]
            load = settle(args.max_load, args.settle)
            with spec.start() as srv:
                r = measure(srv, spec, bodies, args, run_block)
            r["load"] = load
            flagged += load >= args.max_load
            results[(k, w)].append(r)
            print(f"rep {rep + 1}/{args.reps} {spec.label:52s} load {load:4.2f}"
                  f"{' (!)' if load >= args.max_load else ''}  p50 {r['p50']:6.2f} ms  "
                  f"{r['rps']:6.0f} req/s  {r['server_cores']:.2f} server cores  "
                  f"{r['cpu_ms']:5.2f} CPU ms/req  generator "
                  f"{r['generator_cores']:.2f} cores, other processes "
                  f"{r['other_cores']:.2f} cores" + (f"  errors {r['errors']}"
                                                         if r["errors"] else ""), flush=True)
    floor = raw_ort(models, args.task, stays)

    ref = results[rows[0]][0]["risks"]
    worst = max(float(np.abs(np.subtract(r["risks"], ref)).max())
                for rs in results.values() for r in rs)

    def med(row: tuple[str, int], f: str) -> float:
        return float(np.median([r[f] for r in results[row]]))

    def worst_block(row: tuple[str, int]) -> dict[str, Any]:
        """The repetition with the lowest req/s (e.g. a start whose connections landed on one
        worker)."""
        return min(results[row], key=lambda r: r["rps"])

    print()
    print(f"models: {which}; task {args.task}; payloads: {what} "
          f"({np.mean([len(b) for b in bodies]) / 1e3:.1f} kB mean), the {len(stays)} of "
          f"{len(offered)} that meet the model's data minimum (scehr abstains on the others); "
          f"{os.cpu_count()} CPUs ({cpu_model()}); "
          f"load generator: {'wrk -t1' if use_wrk else 'asyncio client (wrk not found)'}; "
          f"{args.connections} connections, {args.seconds:g} s blocks; medians of {args.reps} "
          f"fresh starts per row, and the worst of them; "
          f"{(time.monotonic() - t_start) / 60:.1f} min")
    print(f"1-minute load average before the blocks: "
          f"{min(r['load'] for rs in results.values() for r in rs):.2f}–"
          f"{max(r['load'] for rs in results.values() for r in rs):.2f}"
          + (f"; {flagged} block(s) at or above {args.max_load:g}: NOT VALID, rerun on a "
             "quiet machine" if flagged else f" (all below {args.max_load:g})"))
    print()
    base = [b for b in BASELINES if any(k == b for k, _ in rows)]
    names = {"fastapi-tuned": "FastAPI tuned", "litserve": "LitServe"}
    ratios = "".join(f"req/s ÷ {names[b]} | CPU ÷ {names[b]} | " for b in base)
    # LitServe at w workers runs 2w working processes: the row with as many processes as a
    # scehr row with 2w workers, when both were run
    same_procs = {w: lw for w in args.workers for lw in args.workers
                  if ("litserve", lw) in results and processes("litserve", lw) == w}
    extra = "req/s ÷ LitServe, equal processes | " if same_procs else ""
    print("| server | processes | seq p50 ms | health p50 ms | req/s | worst block req/s | "
          "p99 ms | CPU ms/req | server cores | worst block server cores | generator cores | "
          f"other processes' cores | {ratios}{extra}")
    print("|---|" + "---|" * (11 + 2 * len(base) + bool(extra)))
    for k, w in rows:
        cells = [str(processes(k, w)), f"{med((k, w), 'p50'):.2f}", f"{med((k, w), 'probe'):.2f}",
                 f"{med((k, w), 'rps'):.0f}", f"{worst_block((k, w))['rps']:.0f}",
                 f"{med((k, w), 'p99'):.0f}", f"{med((k, w), 'cpu_ms'):.2f}",
                 f"{med((k, w), 'server_cores'):.2f}",
                 f"{worst_block((k, w))['server_cores']:.2f}",
                 f"{med((k, w), 'generator_cores'):.2f}",
                 f"{med((k, w), 'other_cores'):.2f}"]
        for b in base:
            if (b, w) in results:
                cells += [f"{med((k, w), 'rps') / med((b, w), 'rps'):.2f}x",
                          f"{med((k, w), 'cpu_ms') / med((b, w), 'cpu_ms'):.2f}x"]
            else:
                cells += ["–", "–"]
        if extra:
            lw = same_procs.get(w)
            cells.append(f"{med((k, w), 'rps') / med(('litserve', lw), 'rps'):.2f}x"
                         if lw is not None and not k.startswith("litserve") else "–")
        print(f"| {table[w][k].label} | " + " | ".join(cells) + " |")
    print(f"| raw `session.run`, batch 1, 1 thread | | {floor:.3f} |"
          + " |" * (9 + 2 * len(base) + bool(extra)))
    print()
    print(f"largest risk difference between servers over the same {len(ref)} stays: "
          f"{worst:.2e} (tolerance {TOL:g})")
    shutil.rmtree(tmp, ignore_errors=True)
    if worst > TOL:
        sys.exit(1)
    if flagged:
        sys.exit(2)


if __name__ == "__main__":
    main()
