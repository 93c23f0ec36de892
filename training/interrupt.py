"""Stop training cleanly on Ctrl-C (SIGINT) or SIGTERM: finish the current step, checkpoint,
exit with one line. A second signal while stopping falls back to the default behaviour."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(Exception):
    """Raised by the fit loop after it wrote the resume checkpoint."""

    def __init__(self, run_dir: Path | None, where: str, signum: int) -> None:
        self.run_dir, self.where, self.signum = run_dir, where, signum
        resume = (f"; checkpoint written, continue with `scehr train --resume {run_dir}`"
                  if run_dir else "")
        super().__init__(f"stopped by {signal.Signals(signum).name} after {where}{resume}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


class StopRequest:
    """Context manager: while active, SIGINT/SIGTERM only set `requested` (main thread only;
    elsewhere signals cannot be caught and the context does nothing)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:  # asked twice: stop now, the default way
            self._restore()
            signal.raise_signal(signum)
            return
        self.signum = signum

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def _restore(self) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old.clear()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._restore()
