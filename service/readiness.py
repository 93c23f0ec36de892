"""Readiness across uvicorn workers: `/readyz` says ready only when every worker is.

A probe reaches one worker, but traffic then goes to any of them; right after start another
worker may still be loading and would answer predictions with 503. So each worker, once its
models are warm, leaves a mark `ready-<pid>` in the folder all workers share (the Prometheus
multiprocess folder), and a worker's `/readyz` counts the marks of live processes against the
configured worker count. A mark of a process that is gone (a crashed worker that uvicorn
replaced) is not counted. One worker, or no shared folder: the worker's own state decides.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

MARK = re.compile(r"^ready-(\d+)$")


def shared_folder() -> Path | None:
    """The folder the workers share, when there is one."""
    raw = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    return Path(raw) if raw else None


def mark_ready(folder: Path | None) -> None:
    """Leave this worker's mark (its models are loaded and warm)."""
    if folder is not None:
        (folder / f"ready-{os.getpid()}").touch()


def unmark(folder: Path | None) -> None:
    """Take this worker's mark away (it is shutting down)."""
    if folder is not None:
        (folder / f"ready-{os.getpid()}").unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def ready_workers(folder: Path) -> int:
    """How many live processes have left a mark."""
    try:
        names = [p.name for p in folder.iterdir()]
    except OSError:
        return 0
    return sum(1 for n in names if (m := MARK.match(n)) and _alive(int(m.group(1))))


def all_workers_ready(folder: Path | None, workers: int, self_ready: bool) -> tuple[bool, str]:
    """(ready, "k/n workers ready"): this worker's own state, and with several workers sharing
    a folder, every one of them."""
    if not self_ready:
        return False, f"this worker is not ready ({workers} configured)"
    if workers <= 1 or folder is None:
        return True, "1/1 workers ready" if workers <= 1 else "this worker ready"
    k = ready_workers(folder)
    return k >= workers, f"{min(k, workers)}/{workers} workers ready"
