"""What a user sees while a run trains: one line per epoch, or a bar on a terminal.

Every line also goes to `<run>/train.log`, so a run in the background (or a finished one) can
be followed with `tail -f`. Lines go to stdout when it is not a terminal (CI, `nohup`, a pipe);
on a terminal a tqdm bar shows the same figures and the lines go to the log file only.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from tqdm.auto import tqdm


def format_epoch(row: dict[str, Any], total: int, headline: str, best_val: float,
                 best_epoch: int) -> str:
    """'epoch 3/100  loss 0.3412 (cce 0.3001, scr 5.8612)  val auroc 0.8123  best 0.8123@3
    4.2 s' from a history row; the pre-training phase has no validation and no best."""
    parts = [k[len("train_"):] for k in row if k.startswith("train_") and k != "train_loss"]
    named = ", ".join(f"{p} {row[f'train_{p}']:.4f}" for p in parts)
    text = f"{row.get('phase', 'train')} epoch {row['epoch']}/{total}  " \
           f"loss {row['train_loss']:.4f}" + (f" ({named})" if named else "")
    if f"val_{headline}" in row:
        text += f"  val {headline} {row[f'val_{headline}']:.4f}  best {best_val:.4f}@{best_epoch}"
    return text + f"  {row['seconds']:.1f} s"


class RunLog:
    """Per-epoch lines to `<run>/train.log` (always) and to stdout or a tqdm bar.

    `echo=False` (studies, which print their own progress) keeps stdout quiet; the log file
    is written regardless. `bar=True` shows a bar only when stdout is a terminal.
    """

    def __init__(self, run_dir: Path | None, *, bar: bool = True, echo: bool = True) -> None:
        self.path = run_dir / "train.log" if run_dir is not None else None
        self.echo = echo
        self.use_bar = bar and echo and sys.stdout.isatty()
        self._bar: Any = None

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close_bar()

    def start_bar(self, total: int, initial: int, desc: str) -> None:
        self.close_bar()
        if self.use_bar:
            self._bar = tqdm(total=total, initial=initial, desc=desc, unit="ep")

    def close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def update_bar(self, **postfix: str) -> None:
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(postfix)

    def line(self, text: str) -> None:
        """A line to the log file (time-stamped) and, unless a bar is shown, to stdout."""
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  {text}\n")
        if self.echo and self._bar is None:
            print(text, flush=True)

    def announce(self, text: str) -> None:
        """A step after training that takes a while (bootstrap, plots, t-SNE): said before
        it starts, also on a terminal."""
        self.close_bar()
        self.line(text)


class Progress:
    """'[k/N] what ... (s); ETA' lines: the ETA is the mean time of the cells trained in this
    invocation (read-back cells cost nothing) times the cells left."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.trained, self.seconds = total, 0, 0, 0.0

    def step(self, what: str, seconds: float, trained: bool) -> str:
        self.done += 1
        if trained:
            self.trained, self.seconds = self.trained + 1, self.seconds + seconds
        left = self.total - self.done
        eta = (f"ETA {left * self.seconds / self.trained / 60:.1f} min" if self.trained
               else "ETA n/a")
        how = f"{seconds:.0f} s" if trained else "done before"
        return f"[{self.done}/{self.total}] {what} ({how}); {eta}"
