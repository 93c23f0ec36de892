"""The listfiles of the benchmark's two hourly tasks, `decompensation` and `length-of-stay`.

The reference's `create_decompensation` and `create_length_of_stay`: an ICU stay's rows within
the stay (the phenotyping window) form its timeseries file, and each whole hour t of the stay
with t > 4 and t after the first row is one sample. Decompensation stops at death and labels a
sample 1 when the patient dies in hospital within 24 h of it; length of stay labels it with the
hours left (LOS - t). The test listfile is sorted; the train listfile is shuffled with the
reference's seed (its input order is the file system's, so ours is shuffled from sorted order).

A stay's samples are consecutive hours, so only each stay's first hour and count are kept until
the listfiles are written, and the train shuffle permutes 8-byte sample numbers, not lines.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import numpy as np

DECOMPENSATION = "decompensation"
LENGTH_OF_STAY = "length-of-stay"
HOURLY_TASKS = (DECOMPENSATION, LENGTH_OF_STAY)
HEADER = "stay,period_length,y_true\n"
SHORTEST_HOURS = 4.0
FUTURE_HOURS = 24.0  # decompensation: death within this many hours of the sample
NO_DEATH = 1e18  # the reference's "lived" hours of a stay without a death time
EPS = 1e-6
CHUNK = 1 << 16  # listfile lines formatted at a time


@dataclass(frozen=True)
class StayHours:
    """One stay's samples: hours `first`, `first + 1`, ... (`count` of them)."""

    name: str
    first: float
    count: int
    los: float  # hours
    lived: float  # hours from ICU admission to death, NO_DEATH without a death time
    mortality: int

    def label(self, task: str, t: float) -> str:
        """y_true of the sample at hour `t`, as the reference formats it."""
        if task == DECOMPENSATION:
            return "1" if self.mortality and self.lived - t < FUTURE_HOURS else "0"
        return f"{self.los - t:.6f}"


def sample_hours(end: float, first_row: float) -> np.ndarray:
    """The reference's sample times: every hour from 0 to `end`, after 4 h and the first row."""
    t = np.arange(0.0, end + EPS, 1.0)
    return t[(t > SHORTEST_HOURS) & (t > first_row)]


def lived_hours(intime: Any, deathtime: Any) -> float:
    """Hours from ICU admission to the admission's death time (NO_DEATH without one: a
    missing time is None or NaN, as pandas holds it)."""
    if not (isinstance(deathtime, str) and deathtime and isinstance(intime, str)):
        return NO_DEATH
    return (datetime.fromisoformat(deathtime) - datetime.fromisoformat(intime)
            ).total_seconds() / 3600.0


@dataclass
class HourlyTasks:
    """Collects each stay's sample range per task and split; writes the listfiles at the end."""

    out: Path
    seed: int  # the reference's seed for shuffling the train listfiles
    stays: dict[tuple[str, str], list[StayHours]] = field(default_factory=dict)

    def add(self, split: str, name: str, los: float, first_row: float, stay: Any) -> None:
        """One stay with at least one row within it (`stay`: its all_stays row)."""
        lived = lived_hours(stay.INTIME, stay.DEATHTIME)
        for task, end in ((DECOMPENSATION, min(los, lived)), (LENGTH_OF_STAY, los)):
            t = sample_hours(end, first_row)
            first = float(t[0]) if len(t) else 0.0
            self.stays.setdefault((task, split), []).append(
                StayHours(name, first, len(t), los, lived, int(stay.MORTALITY)))

    def finish(self, val_set: set[str]) -> dict[str, dict[str, int]]:
        """Both tasks' listfiles, and split_train_val's train/val/test_listfile.csv."""
        summary = {}
        for task in HOURLY_TASKS:
            tdir = self.out / task
            counts: dict[str, int] = {}
            for split in ("test", "train"):
                stays = sorted(self.stays.get((task, split), []), key=lambda s: s.name)
                order = None
                if split == "train":
                    order = array("q", range(sum(s.count for s in stays)))
                    random.Random(self.seed).shuffle(order)
                with open(tdir / split / "listfile.csv", "w") as f:
                    f.write(HEADER)
                    if split == "test":
                        for lines in _lines(task, stays, order):
                            f.writelines(lines)
                    else:
                        with open(tdir / "train_listfile.csv", "w") as tr, \
                                open(tdir / "val_listfile.csv", "w") as va:
                            _write_train(task, stays, order, val_set, f, tr, va)
                counts[split] = len(stays)
                counts[f"{split}_samples"] = sum(s.count for s in stays)
            (tdir / "test_listfile.csv").write_bytes((tdir / "test" / "listfile.csv").read_bytes())
            summary[task] = counts
        return summary


def _write_train(task: str, stays: list[StayHours], order: array | None, val_set: set[str],
                 listfile: TextIO, train: TextIO, val: TextIO) -> None:
    """The shuffled train listfile, and its rows split by subject into train and validation."""
    train.write(HEADER)
    val.write(HEADER)
    for lines in _lines(task, stays, order):
        listfile.writelines(lines)
        for ln in lines:
            (val if ln[:ln.find("_")] in val_set else train).write(ln)


def _lines(task: str, stays: list[StayHours], order: array | None) -> Iterator[list[str]]:
    """Listfile lines, CHUNK at a time: sample number i of the stays' samples in order, or the
    samples in `order` (a permutation of those numbers)."""
    counts = np.array([s.count for s in stays], dtype=np.int64)
    ends = np.cumsum(counts)
    n = int(ends[-1]) if len(ends) else 0
    for lo in range(0, n, CHUNK):
        idx = (np.frombuffer(order, dtype=np.int64, count=min(CHUNK, n - lo), offset=8 * lo)
               if order is not None else np.arange(lo, min(lo + CHUNK, n)))
        which = np.searchsorted(ends, idx, side="right")
        hour = idx - (ends[which] - counts[which])
        lines = []
        for w, k in zip(which.tolist(), hour.tolist(), strict=True):
            s = stays[w]
            t = s.first + k
            lines.append(f"{s.name},{t:.6f},{s.label(task, t)}\n")
        yield lines

