"""Write stays in the mimic3-benchmarks layout: one wide `*_timeseries.csv` per stay + listfiles.

Converters and the synthetic generator build one `Observations` for many stays and hand it here;
the pivot to wide rows and the CSV formatting are done once for all stays (pandas), then the
text is cut per stay, so writing thousands of files costs little more than the disk writes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from scehr.schemas.featureset import FeatureSet
from scehr.schemas.tensorize import Observations


def header(fs: FeatureSet) -> str:
    """The benchmark header: `Hours` then the channels' benchmark names in feature-set order."""
    return ",".join(["Hours", *(v.benchmark_name for v in fs.variables)])


def _last_per_cell(row: np.ndarray, channel: np.ndarray, n_channels: int) -> np.ndarray:
    """Index of the last observation of each (row, channel) cell, in input order."""
    cell = row * n_channels + channel
    perm = np.argsort(cell, kind="stable")
    last = np.ones(len(perm), dtype=bool)
    last[:-1] = cell[perm][1:] != cell[perm][:-1]
    return perm[last]


def wide_lines(obs: Observations, fs: FeatureSet) -> tuple[list[str], np.ndarray]:
    """CSV body lines (no header) for all stays, and the number of lines of each stay.

    Observations at the same time of the same stay share one row; if a channel has several
    values at one time, the last one (input order) is written, as the benchmark keeps it.
    """
    order = np.lexsort((np.arange(len(obs)), obs.time, obs.stay))
    stay, time = obs.stay[order], obs.time[order]
    channel, value = obs.channel[order], obs.value[order]
    new_row = np.ones(len(order), dtype=bool)
    new_row[1:] = (stay[1:] != stay[:-1]) | (time[1:] != time[:-1])
    row = np.cumsum(new_row) - 1
    n_rows = int(row[-1]) + 1 if len(row) else 0
    keep = _last_per_cell(row, channel, fs.n_channels)

    grid = np.full((n_rows, fs.n_channels), np.nan)
    grid[row[keep], channel[keep]] = value[keep]
    cols: dict[str, Any] = {"Hours": time[new_row]}
    for i, v in enumerate(fs.variables):
        if v.is_categorical:
            names = np.array([*v.categories, ""], dtype=object)
            idx = np.where(np.isnan(grid[:, i]), len(v.categories), grid[:, i]).astype(np.int64)
            cols[v.benchmark_name] = names[idx]
        else:
            cols[v.benchmark_name] = grid[:, i]
    text = pd.DataFrame(cols).to_csv(header=False, index=False, na_rep="", lineterminator="\n")
    lines = text.split("\n")[:n_rows] if n_rows else []
    counts = np.bincount(stay[new_row], minlength=obs.n_stays)
    return lines, counts


def write_timeseries(directory: Path, names: Sequence[str], obs: Observations, fs: FeatureSet,
                     *, progress: bool | None = None, desc: str = "write") -> None:
    """Write `names[i]` (a `*_timeseries.csv` file name) for every stay i of `obs`."""
    if len(names) != obs.n_stays:
        raise ValueError(f"{len(names)} names for {obs.n_stays} stays")
    directory.mkdir(parents=True, exist_ok=True)
    lines, counts = wide_lines(obs, fs)
    head = header(fs) + "\n"
    ends = np.cumsum(counts)
    starts = ends - counts
    for i in tqdm(range(obs.n_stays), desc=desc, unit="stay", disable=_disable(progress),
                  leave=False):
        body = "\n".join(lines[starts[i]:ends[i]])
        (directory / names[i]).write_text(head + body + ("\n" if body else ""))


def write_listfile(path: Path, table: pd.DataFrame) -> None:
    """A listfile as the benchmark writes it: CSV with a header, no index."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(path, index=False, lineterminator="\n")


def write_task_listfiles(task_dir: Path, train: pd.DataFrame, val_mask: np.ndarray,
                         test: pd.DataFrame) -> None:
    """`train/listfile.csv` (train + val), `test/listfile.csv`, and the benchmark's split files.

    `train_listfile.csv`, `val_listfile.csv` and `test_listfile.csv` go in the task folder, where
    the benchmark's `split_train_val` step puts them.
    """
    write_listfile(task_dir / "train" / "listfile.csv", train)
    write_listfile(task_dir / "test" / "listfile.csv", test)
    write_listfile(task_dir / "train_listfile.csv", train[~val_mask])
    write_listfile(task_dir / "val_listfile.csv", train[val_mask])
    write_listfile(task_dir / "test_listfile.csv", test)


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _disable(progress: bool | None) -> bool | None:
    """tqdm's `disable`: None = show only on a terminal."""
    return None if progress is None else not progress
