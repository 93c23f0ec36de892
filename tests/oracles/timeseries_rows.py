"""A line-by-line reader of benchmark `*_timeseries.csv` files: the slow, obvious oracle for
`scehr.training.data.reader.read_timeseries` (which parses many files per `pandas.read_csv` call).

Each line is split on commas; a cell becomes a number with `float` or a category index with
`Variable.category_index`; rows are ordered by (stay, time, line, column) and the one cleaning
step (`scehr.schemas.tensorize.clean`) is applied to the result, as the reader does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from scehr.schemas.featureset import FeatureSet
from scehr.schemas.tensorize import Observations, clean
from scehr.schemas.variables import CategoryError


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return np.nan


def read_rows(paths: list[Path], fs: FeatureSet) -> tuple[Observations, dict[str, object]]:
    """(cleaned observations, counts: rows, rows_without_time, unknown, invalid per channel)."""
    index = {}
    for i, v in enumerate(fs.variables):
        index[v.benchmark_name.lower()] = index[v.id.lower()] = i
    cells: list[tuple[int, float, int, int, int, float]] = []
    invalid = np.zeros(fs.n_channels, dtype=np.int64)
    unknown: list[str] = []
    n_rows = no_time = 0
    for stay, path in enumerate(paths):
        lines = [ln for ln in path.read_bytes().decode("utf-8-sig").splitlines() if ln.strip()]
        names = [n.strip().strip('"') for n in lines[0].split(",")]
        lower = [n.lower() for n in names]
        unknown += [n for n, low in zip(names, lower, strict=True)
                    if low != "hours" and low not in index and n not in unknown]
        for line_no, line in enumerate(lines[1:]):
            n_rows += 1
            row = line.split(",")
            hours = _number(row[lower.index("hours")])
            no_time += int(np.isnan(hours))
            for col, (low, text) in enumerate(zip(lower, row, strict=True)):
                if low == "hours" or low not in index or text == "":
                    continue
                ch = index[low]
                var = fs.variables[ch]
                if var.is_categorical:
                    try:
                        value = float(var.category_index(text.strip()))
                    except CategoryError:
                        value = np.nan
                else:
                    value = _number(text)
                if np.isnan(value):
                    invalid[ch] += 1
                elif not np.isnan(hours):
                    cells.append((stay, hours, line_no, col, ch, value))
    cells.sort(key=lambda c: c[:4])
    stay_, time, _, _, channel, value = (np.array([c[k] for c in cells]) for k in range(6))
    obs = Observations(stay_, channel, time, value, len(paths))
    kept, _ = clean(obs, fs)
    return kept, {"rows": n_rows, "rows_without_time": no_time, "unknown_columns": unknown,
                  "invalid": invalid}
