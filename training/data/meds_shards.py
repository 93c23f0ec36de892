"""MEDS data shards read by row groups: some subjects' events without reading the rest.

A MEDS dataset's `data/**/*.parquet` shards hold each subject in one shard, sorted by
`subject_id` then `time`, so the subject-id range of every row group is in the Parquet footer.
`row_groups` lists them from the footers alone; `read_subjects` reads only the row groups whose
range holds a wanted subject; `iter_subjects` walks the shards one row group at a time and
yields the events of a few whole subjects at a time. Either way the memory is a row group (and
the subjects asked for), not the dataset; every table is checked against `meds.DataSchema`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

SUBJECT = "subject_id"


@dataclass(frozen=True)
class RowGroup:
    """One row group of one shard and the subject ids it holds (from the footer)."""

    path: Path
    index: int
    rows: int
    first: int | None  # None: the footer has no statistics, so the group is always read
    last: int | None

    def may_hold(self, wanted: np.ndarray) -> bool:
        """Whether any of the sorted ids `wanted` falls in this group's range."""
        if self.first is None or self.last is None:
            return True
        i = int(np.searchsorted(wanted, self.first))
        return i < len(wanted) and wanted[i] <= self.last


def row_groups(meds_dir: Path) -> list[RowGroup]:
    """Every row group of the dataset's data shards, in file then group order."""
    import meds

    files = sorted((Path(meds_dir) / meds.data_subdirectory).rglob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no MEDS data under {Path(meds_dir) / meds.data_subdirectory} "
                                "(expected data/**/*.parquet)")
    out = []
    for path in files:
        meta = pq.ParquetFile(path).metadata
        col = meta.schema.to_arrow_schema().get_field_index(SUBJECT)
        if col < 0:
            raise ValueError(f"{path} does not follow the MEDS schema: no {SUBJECT} column")
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(col).statistics
            known = stats is not None and stats.has_min_max
            out.append(RowGroup(path, g, meta.row_group(g).num_rows,
                                int(stats.min) if known else None,
                                int(stats.max) if known else None))
    return out


def _read(group: RowGroup, columns: Sequence[str] | None) -> pa.Table:
    import meds

    table = pq.ParquetFile(group.path).read_row_group(group.index)
    try:
        table = meds.DataSchema.align(table)
    except Exception as e:  # the meds package raises its own error types
        raise ValueError(f"{group.path} does not follow the MEDS schema: {e}") from e
    return table.select(list(columns)) if columns is not None else table


def read_subjects(groups: Sequence[RowGroup], subjects: Sequence[int] | np.ndarray,
                  columns: Sequence[str] | None = None) -> pa.Table:
    """The events of `subjects`, in file order, reading only the row groups that may hold
    them. `columns`: those to keep (subject_id among them to tell subjects apart)."""
    wanted = np.unique(np.asarray(subjects, dtype=np.int64))
    keep = pa.array(wanted)
    parts = []
    for group in groups:
        if group.may_hold(wanted):
            table = _read(group, None)
            table = table.filter(pc.is_in(table[SUBJECT], value_set=keep))
            parts.append(table.select(list(columns)) if columns is not None else table)
    if not parts:
        import meds

        schema = meds.DataSchema.schema()
        empty = schema.empty_table()
        return empty.select(list(columns)) if columns is not None else empty
    return pa.concat_tables(parts)


def iter_subjects(groups: Sequence[RowGroup], per_batch: int,
                  columns: Sequence[str] | None = None) -> Iterator[pa.Table]:
    """Tables of the events of at most `per_batch` whole subjects each, every subject once, in
    file order; one row group is read at a time (a subject whose events run on into the next
    row group of its shard waits for them)."""
    if per_batch < 1:
        raise ValueError(f"per_batch must be >= 1, not {per_batch}")
    pending: list[pa.Table] = []
    for k, group in enumerate(groups):
        pending.append(_read(group, columns))
        buffer = pa.concat_tables(pending)
        ids = buffer[SUBJECT].to_numpy()
        last_in_file = k + 1 == len(groups) or groups[k + 1].path != group.path
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]]) if len(ids) else ids
        # whole subjects: all but the last, which may go on in the next group of its shard
        complete = len(starts) if last_in_file else len(starts) - 1
        done = 0
        while complete - done >= per_batch or (last_in_file and done < complete):
            n = min(per_batch, complete - done)
            end = starts[done + n] if done + n < len(starts) else len(ids)
            yield buffer.slice(starts[done], end - starts[done])
            done += n
        rest = starts[done] if done < len(starts) else len(ids)
        pending = [buffer.slice(rest)] if rest < len(ids) else []


def code_counts(groups: Sequence[RowGroup]) -> dict[str, int]:
    """Every code of the dataset with its number of events, in order of first appearance;
    one row group is read at a time."""
    counts: dict[str, int] = {}
    for group in groups:
        table = _read(group, ["code"])
        codes, n = (a.to_pylist() for a in pc.value_counts(table["code"]).flatten())
        for code, k in zip(codes, n, strict=True):
            counts[code] = counts.get(code, 0) + k
    return counts

