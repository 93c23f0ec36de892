"""With several workers, /readyz says ready only when every worker has its models warm."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from scehr.service import readiness
from scehr.service.settings import Settings
from tests.service.conftest import serve

pytestmark = pytest.mark.anyio


def dead_pid() -> int:
    """The pid of a process that has exited."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_marks_of_live_processes_only_are_counted(tmp_path: Path) -> None:
    assert readiness.ready_workers(tmp_path) == 0
    readiness.mark_ready(tmp_path)
    (tmp_path / f"ready-{dead_pid()}").touch()  # a crashed worker's mark
    (tmp_path / "counter_123.db").touch()
    assert readiness.ready_workers(tmp_path) == 1
    assert readiness.all_workers_ready(tmp_path, 2, True) == (False, "1/2 workers ready")
    (tmp_path / f"ready-{os.getppid()}").touch()  # another live process
    assert readiness.all_workers_ready(tmp_path, 2, True) == (True, "2/2 workers ready")
    assert readiness.all_workers_ready(tmp_path, 2, False)[0] is False
    readiness.unmark(tmp_path)
    assert readiness.ready_workers(tmp_path) == 1
    assert readiness.ready_workers(tmp_path / "absent") == 0


async def test_readyz_waits_for_every_worker(make_settings: Callable[..., Settings],
                                             tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    async with serve(make_settings(workers=2), wait=False) as c:
        for _ in range(600):  # this worker's models load in the background
            if (tmp_path / f"ready-{os.getpid()}").exists():
                break
            await asyncio.sleep(0.05)
        r = await c.get("/readyz")
        assert r.status_code == 503 and r.json()["workers"] == "1/2 workers ready"
        (tmp_path / f"ready-{os.getppid()}").touch()  # the other worker is ready now
        r = await c.get("/readyz")
        assert r.status_code == 200 and r.json()["workers"] == "2/2 workers ready"
    assert not (tmp_path / f"ready-{os.getpid()}").exists()  # its mark goes at shutdown
