"""Output files written on worker threads, with a cap on the bytes waiting to be written.

An extraction creates one file per subject table, episode and task row (9,324 files for 1,246
subjects); creating a file costs far more than writing its bytes on common file systems (new
inodes, directory entries, journal). Done inline, that time adds to DuckDB's; on worker threads
(`os.open`/`os.write` release the GIL) it overlaps the query that produces the next rows.
Memory stays bounded: `write` blocks while more than `max_pending` bytes are queued.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

Chunk = bytes | bytearray | memoryview
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0)


class FileWriter:
    """`write(path, *chunks)` queues a whole file; `close()` waits for all and re-raises the
    first error (a failed write also stops later `write` calls with that error)."""

    def __init__(self, workers: int = 4, max_pending: int = 64 << 20) -> None:
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="mimic3-write")
        self._max = max_pending
        self._pending = 0
        self._cond = threading.Condition()
        self._error: BaseException | None = None

    def write(self, path: Path, *chunks: Chunk) -> None:
        """Queue `path` with the concatenation of `chunks` (kept alive until written)."""
        size = sum(memoryview(c).nbytes for c in chunks)
        with self._cond:
            while self._pending and self._pending + size > self._max and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise self._error
            self._pending += size
        self._pool.submit(self._write, path, chunks, size)

    def mkdirs(self, paths: list[Path]) -> None:
        """Create folders (and parents) on the worker threads; returns when all exist."""
        list(self._pool.map(lambda p: p.mkdir(parents=True, exist_ok=True), paths))

    def _write(self, path: Path, chunks: tuple[Chunk, ...], size: int) -> None:
        try:
            fd = os.open(path, _FLAGS, 0o644)
            try:
                for chunk in chunks:
                    view = memoryview(chunk).cast("B")
                    while view:
                        view = view[os.write(fd, view):]
            finally:
                os.close(fd)
        except BaseException as e:  # handed to the caller's thread
            with self._cond:
                self._error = self._error or e
        finally:
            with self._cond:
                self._pending -= size
                self._cond.notify_all()

    def close(self) -> None:
        """Wait for every queued file; raise the first write error."""
        self._pool.shutdown(wait=True)
        if self._error is not None:
            raise self._error

    def __enter__(self) -> FileWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is None:
            self.close()
        else:
            self._pool.shutdown(wait=True)
