"""`scehr serve --workers 2` as a process: each worker accepts on a socket of its own, so
connections spread over both; the port in use is one clear line; a killed worker is replaced;
SIGTERM stops it gracefully with status 0."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.service.conftest import wait_until_serving
from tests.service.test_svc_process import free_port, scehr_command

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="SO_REUSEPORT spreads connections on Linux only")]


def serve_command(model_dir: Path, port: int) -> list[str]:
    return [*scehr_command(), "serve", "--port", str(port), "--model-dir", str(model_dir),
            "--device", "cpu", "--workers", "2"]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith("SCEHR_") and k != "PROMETHEUS_MULTIPROC_DIR"}


@contextmanager
def two_workers(model_dir: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen, str]]:
    """A running server, ready (both workers warm); stopped by SIGTERM unless already stopped."""
    port = free_port()
    log = (tmp_path / "serve.log").open("w+")
    proc = subprocess.Popen(serve_command(model_dir, port), cwd=tmp_path, env=clean_env(),
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(proc, base, Path(log.name).read_text, timeout=90)
        yield proc, base
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()


def pids_of_connections(base: str, n: int) -> list[int]:
    """n keep-alive connections open at once; the worker pid each one is served by."""
    clients = [httpx.Client(base_url=base, timeout=30,
                            limits=httpx.Limits(max_connections=1)) for _ in range(n)]
    try:
        first = [c.get("/models").json()["models"][0]["worker_pid"] for c in clients]
        # asked again on the same connections: each stays with the worker that accepted it
        again = [c.get("/models").json()["models"][0]["worker_pid"] for c in clients]
        assert first == again
        return first
    finally:
        for c in clients:
            c.close()


def listening_sockets(port: int) -> set[str]:
    """The inodes of the TCP sockets listening on the port (Linux /proc)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].split(":")[1], 16) == port and fields[3] == "0A":
                found.add(fields[9])
    return found


def sockets_of(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def test_each_worker_accepts_on_its_own_socket_and_both_serve(
        model_dir: Path, tmp_path: Path) -> None:
    with two_workers(model_dir, tmp_path) as (proc, base):
        port = int(base.rsplit(":", 1)[1])
        pids = Counter(pids_of_connections(base, 64))
        assert len(pids) == 2, f"one worker held every connection: {pids}"
        # spread by the kernel's hash: far from one worker holding most of them
        assert min(pids.values()) >= 12, pids
        listening = listening_sockets(port)
        assert len(listening) == 2, f"one listening socket shared by the workers: {listening}"
        owners = {pid: sockets_of(pid) & listening for pid in pids}
        assert all(len(own) == 1 for own in owners.values()), owners
        assert set().union(*owners.values()) == listening
        assert not sockets_of(proc.pid) & listening  # the parent only holds the port


def test_a_killed_worker_is_replaced_and_sigterm_stops_gracefully(
        model_dir: Path, tmp_path: Path) -> None:
    with two_workers(model_dir, tmp_path) as (proc, base):
        port = int(base.rsplit(":", 1)[1])
        before = set(pids_of_connections(base, 16))
        assert len(before) == 2
        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 90
        while True:
            listening = listening_sockets(port)
            if len(listening) == 2 and not os.path.exists(f"/proc/{victim}"):
                try:
                    now = set(pids_of_connections(base, 16))
                except httpx.TransportError:
                    now = set()
                if len(now) == 2 and victim not in now:
                    break
            assert proc.poll() is None, "the server stopped when a worker died"
            assert time.monotonic() < deadline, "the killed worker was never replaced"
            time.sleep(0.5)
        assert len(now & before) == 1  # the other worker served on, untouched
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    log = (tmp_path / "serve.log").read_text()
    assert log.count("Shutting down") == 2 and "Traceback" not in log


def test_port_in_use_is_one_clear_line_before_any_worker_starts(
        model_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run(serve_command(model_dir, port), cwd=tmp_path, env=clean_env(),
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert lines == [f"scehr serve: cannot listen on 127.0.0.1:{port}: Address already in use"]
    assert "Started server process" not in r.stdout + r.stderr


# ------------------------------------------------------------- service/workers.py in-process


def test_a_worker_receives_a_socket_of_its_own_on_the_reserved_address() -> None:
    """What crosses to a worker (pickled, as uvicorn's spawn does) is a fresh SO_REUSEPORT
    socket bound to the reserved address, not a copy of the parent's."""
    import pickle

    from scehr.service.workers import Reservation

    reservation = Reservation("127.0.0.1", free_port())
    try:
        own = pickle.loads(pickle.dumps([reservation]))[0]
        with own:
            assert isinstance(own, socket.socket) and own.fileno() != reservation.socket.fileno()
            assert own.getsockname() == reservation.socket.getsockname()
            assert own.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
            own.listen()
            assert listening_sockets(own.getsockname()[1])  # it, not the reservation, listens
    finally:
        reservation.close()


@pytest.mark.parametrize("reserved", [True, False])
def test_run_workers_hands_uvicorns_supervisor_the_right_socket(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str], reserved: bool) -> None:
    """A reservation goes to the supervisor as the workers' socket; without one (no
    SO_REUSEPORT balancing) one shared socket, said in the log. A worker that failed at
    startup makes the exit status 1."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE

    from scehr.service import workers

    seen: list[object] = []

    class FakeSupervisor:
        def __init__(self, config: uvicorn.Config, sockets: list[object]) -> None:
            seen.extend(sockets)
            self.processes = [type("P", (), {"exitcode": 0})(),
                              type("P", (), {"exitcode": STARTUP_FAILURE})()]

        def run(self) -> None:
            pass

    monkeypatch.setattr(workers, "Multiprocess", FakeSupervisor)
    port = free_port()
    config = uvicorn.Config("scehr.service.app:build_app", host="127.0.0.1", port=port,
                            workers=2, log_config=None)
    workers.logger.addHandler(caplog.handler)  # uvicorn's loggers need not propagate
    reservation = workers.Reservation("127.0.0.1", port) if reserved else None
    try:
        with caplog.at_level("INFO", logger="uvicorn.error"):
            assert workers.run_workers(config, reservation) == 1
    finally:
        workers.logger.removeHandler(caplog.handler)
        if reservation is not None:
            reservation.close()
    assert "a worker failed to start" in capsys.readouterr().err
    if reserved:
        assert seen == [reservation] and "its own SO_REUSEPORT socket" in caplog.text
    else:
        assert isinstance(seen[0], socket.socket) and seen[0].fileno() == -1  # closed after
        assert "share one listening socket" in caplog.text
