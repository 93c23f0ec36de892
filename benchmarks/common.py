"""Shared pieces of the benchmarks: models, realistic stays, a server process, a lean client.

The client is a few lines of raw HTTP/1.1 over asyncio streams (keep-alive, pre-encoded
requests) so that on a 2-core machine the load generator takes as little CPU from the server
as possible; figures are printed, never asserted.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scehr.schemas.featureset import FeatureSet

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def real_models() -> Path:
    """The model folder benchmarks serve: $BENCH_MODEL_DIR (e.g. a copy of models/ whose
    index makes mortality 1.1.0 the default, to compare with figures measured on it), else
    the repo's models/."""
    return Path(os.environ.get("BENCH_MODEL_DIR") or REPO / "models")


def model_dir() -> tuple[Path, str]:
    """The real model folder when it has an index, else fresh fixture models (and which)."""
    real = real_models()
    if (real / "index.json").is_file():
        from scehr.service.registry import read_index

        defaults = read_index(real).defaults
        return real, f"default models of {real}/index.json (" + ", ".join(
            f"{t} {v}" for t, v in sorted(defaults.items())) + ")"
    from tests.service.fixture_model import write_model_dir

    d = Path(tempfile.mkdtemp(prefix="scehr-bench-"))
    return write_model_dir(d, lstm_hidden=16), ("fixture models (tests/service/fixture_model.py"
                                                 ", ONNX LSTM 16 units; no real models yet)")


def full_stay(seed: int, hours: int = 48, fs: FeatureSet | None = None) -> dict[str, Any]:
    """A complete synthetic stay of `hours` hours (default 48) in the variables of `fs`.

    For the benchmark's 17 variables (the default, and the feature set of the 1.0/1.1
    models): hourly vitals, 4-hourly GCS/FiO2/temperature, labs (386 observations, 24 kB of
    JSON for 48 h; ~8 per hour), as every earlier benchmark figure used. Any other feature set
    (e.g. the full PhysioNet set of mortality 1.2.0, which rejects `systolic_bp`) gets
    `feature_set_stay`: a stay it accepts, not a 422 the benchmark would time instead."""
    if fs is not None and not set(_BENCHMARK17) <= set(fs.variable_ids):
        return feature_set_stay(fs, seed, hours)
    rng = np.random.default_rng(seed)
    obs: list[dict[str, Any]] = []

    def add(var: str, t: float, v: float | str, unit: str | None = None) -> None:
        o: dict[str, Any] = {"variable": var, "time": round(t, 2), "value": v}
        if unit:
            o["unit"] = unit
        obs.append(o)

    for h in range(hours):
        t = h + 0.5
        sbp = float(rng.normal(120, 15))
        dbp = float(rng.normal(65, 10))
        add("heart_rate", t, round(float(rng.normal(88, 12)), 1), "bpm")
        add("systolic_bp", t, round(sbp, 1), "mmHg")
        add("diastolic_bp", t, round(dbp, 1), "mmHg")
        add("mean_bp", t, round((sbp + 2 * dbp) / 3, 1), "mmHg")
        add("respiratory_rate", t, round(float(rng.normal(19, 4)), 1))
        add("o2_saturation", t, round(float(min(100, rng.normal(96, 2))), 1), "%")
        if h % 4 == 0:
            add("temperature", t, round(float(rng.normal(37.0, 0.6)), 2), "Cel")
            add("gcs_eye", t, int(rng.integers(2, 5)))
            add("gcs_motor", t, int(rng.integers(4, 7)))
            add("gcs_verbal", t, int(rng.integers(3, 6)))
            add("gcs_total", t, str(int(rng.integers(9, 16))))
            add("fio2", t, round(float(rng.uniform(0.21, 0.6)), 2), "fraction")
            add("capillary_refill_rate", t, "0.0")
        if h % 6 == 0:
            add("glucose", t, round(float(rng.normal(140, 30)), 1), "mg/dL")
        if h % 12 == 0:
            add("ph", t, round(float(rng.normal(7.38, 0.05)), 3))
    add("weight", 1.0, round(float(rng.normal(80, 15)), 1), "kg")
    add("height", 1.0, round(float(rng.normal(170, 10)), 1), "cm")
    return {"id": f"bench-{seed}", "observations": obs,
            "demographics": {"age": int(rng.integers(20, 90)),
                             "sex": "male" if seed % 2 else "female"}}


_BENCHMARK17 = ("heart_rate", "systolic_bp", "diastolic_bp", "mean_bp", "respiratory_rate",
                "o2_saturation", "temperature", "gcs_eye", "gcs_motor", "gcs_verbal",
                "gcs_total", "fio2", "capillary_refill_rate", "glucose", "ph", "weight",
                "height")
#: Hours between observations by position in the feature set, about full_stay's density.
_EVERY = (1,) * 6 + (4,) * 6


def feature_set_stay(fs: FeatureSet, seed: int, hours: int = 48) -> dict[str, Any]:
    """A synthetic stay any model of `fs` accepts: every variable in its canonical unit, near
    its normal value (log-normal, 3 % spread) inside its valid and plausible ranges, or a
    random category; the first six variables hourly, the next six every 4 h, the rest every
    12 h."""
    rng = np.random.default_rng(seed)
    obs: list[dict[str, Any]] = []
    for k, var in enumerate(fs.variables):
        every = _EVERY[k] if k < len(_EVERY) else 12
        for h in range(0, hours, every):
            o: dict[str, Any] = {"variable": var.id, "time": h + 0.5}
            if var.is_categorical:
                o["value"] = str(var.categories[int(rng.integers(len(var.categories)))])
            else:
                lo, hi = ((var.ranges.valid_low, var.ranges.valid_high) if var.ranges
                          else (-np.inf, np.inf))
                if var.plausible is not None and var.plausible.high is not None:
                    hi = min(hi, var.plausible.high)
                # log-normal around the normal value: never crosses 0 (open plausible bounds)
                value = np.clip(var.normal_float * np.exp(rng.normal(0.0, 0.03)), lo, hi)
                o["value"] = round(float(value), 4)
                if var.unit:
                    o["unit"] = var.unit
            obs.append(o)
    return {"id": f"bench-{seed}", "observations": obs,
            "demographics": {"age": int(rng.integers(20, 90)),
                             "sex": "male" if seed % 2 else "female"}}


def loadavg() -> str:
    """The 1-, 5- and 15-minute load averages (call it before timing anything)."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_PROFILED = """import cProfile, sys
from scehr.cli import main
prof = cProfile.Profile()
try:
    prof.runcall(main, sys.argv[2:])
finally:
    prof.dump_stats(sys.argv[1])
"""


@dataclass
class Server:
    port: int
    pid: int

    def cpu_seconds(self) -> float:
        """User + system CPU time the server and its live worker processes have used so far."""
        return tree_cpu_seconds(self.pid)


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of `root` and its live descendants (Linux /proc; uvicorn's workers are
    children of the server process)."""
    stats: dict[int, tuple[int, float]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(d.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12]))
                              / os.sysconf("SC_CLK_TCK"))
    keep, total = {root}, 0.0
    changed = True
    while changed:
        changed = False
        for pid, (ppid, _) in stats.items():
            if ppid in keep and pid not in keep:
                keep.add(pid)
                changed = True
    for pid in keep:
        total += stats.get(pid, (0, 0.0))[1]
    return total


def wait_until_healthy(proc: subprocess.Popen[bytes], port: int, path: str, log_name: str,
                       *, timeout_s: float, poll_s: float, what: str = "server") -> None:
    """Poll `GET path` on the loopback `port` until it answers 200; raise, naming the log,
    when the process exits first or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    request = f"GET {path} HTTP/1.1\r\nHost: b\r\n\r\n".encode()
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited; see {log_name}")
        try:
            status, _ = asyncio.run(one_request(port, request))
            if status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} never became ready; see {log_name}")
        time.sleep(poll_s)


@contextmanager
def server(models: Path, profile: Path | None = None, device: str = "cpu", workers: int = 1,
           **settings: Any) -> Iterator[Server]:
    """`scehr serve --workers N` on a free loopback port until ready; SIGTERM on exit. With
    `profile`, the server runs under cProfile (wall-clock timer: a per-thread CPU timer would
    halve the server's speed) and writes its statistics there when it stops."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCEHR_")}
    env.update({f"SCEHR_{k.upper()}": str(v) for k, v in settings.items()})
    log = open(tempfile.mkstemp(prefix="scehr-bench-", suffix=".log")[1], "w")  # noqa: SIM115
    exe = Path(sys.executable).parent / "scehr"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "scehr.cli"]
    if profile is not None:
        cmd = [sys.executable, "-c", _PROFILED, str(profile)]
    proc = subprocess.Popen([*cmd, "serve", "--port", str(port), "--model-dir", str(models),
                             "--device", device, "--workers", str(workers)],
                            stdout=log, stderr=log, env=env, cwd=REPO)
    try:
        wait_until_healthy(proc, port, "/readyz", log.name, timeout_s=60, poll_s=0.1)
        yield Server(port, proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        log.close()


def post(path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return status, await reader.readexactly(length)


async def one_request(port: int, raw: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        return await read_response(reader)
    finally:
        writer.close()


class Conn:
    """One keep-alive connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Conn:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def send(self, raw: bytes) -> tuple[int, bytes]:
        self.writer.write(raw)
        await self.writer.drain()
        return await read_response(self.reader)

    def close(self) -> None:
        self.writer.close()


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def metric_sums(text: str, name: str, model: str) -> tuple[float, float]:
    """(sum, count) of a histogram for one model from a Prometheus exposition."""
    s = c = 0.0
    for line in text.splitlines():
        if f'model="{model}"' not in line:
            continue
        if line.startswith(f"{name}_sum"):
            s += float(line.split()[-1])
        elif line.startswith(f"{name}_count"):
            c += float(line.split()[-1])
    return s, c


def describe(model: Any) -> str:
    """What a benchmark really ran: model name and version, encoder, provider, ORT threads."""
    m = model.spec.manifest
    threads = model.session.get_session_options().intra_op_num_threads
    return (f"{m.name} {m.version} ({m.encoder.name} {m.encoder.hparams}); "
            f"{model.provider}, {threads} intra-op threads")


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()
