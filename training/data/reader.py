"""Read the mimic3-benchmarks output layout: listfiles, splits, timeseries CSVs, demographics.

All timeseries files of a split are parsed in one go: their bodies are concatenated (grouped by
header line) and handed to one call of pyarrow's CSV reader (pandas for a group it rejects); the
stay of each row comes from the per-file line counts. Values become `Observations` (canonical
numbers, category indices) and the plausibility and benchmark cleaning rules
(`scehr.schemas.tensorize.clean`) are applied and counted.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
from tqdm.auto import tqdm

from scehr.schemas.featureset import STATIC_FIELDS, FeatureSet
from scehr.schemas.tasks import task_spec
from scehr.schemas.tensorize import Observations, clean, in_stay_time_order
from scehr.schemas.variables import CategoryError, Variable
from scehr.training.data.layout import (
    DEMOGRAPHICS_FILE,
    benchmark_valset_path,
    split_groups,
    subject_of,
)
from scehr.training.data.writer import _disable

#: Share of a train listfile's subjects that a `valset.csv` must list to be used for it.
VALSET_MIN_COVERAGE = 0.99
#: Bytes of CSV text parsed per `read_csv` call.
BATCH_BYTES = 128 << 20


# ---------------------------------------------------------------- listfiles and splits


@dataclass
class SplitSpec:
    """The listfile rows of one split and where their files are."""

    table: pd.DataFrame
    files_dir: Path
    source: str
    inputs: list[Path] = field(default_factory=list)

    @property
    def demographics(self) -> Path:
        return self.files_dir / DEMOGRAPHICS_FILE


def read_listfile(path: Path, task: str) -> pd.DataFrame:
    """A listfile with its columns checked: `stay,y_true` or `stay,period_length,<labels>`."""
    if not path.is_file():
        raise FileNotFoundError(f"listfile not found: {path}")
    table = pd.read_csv(path, dtype={"stay": str})
    table.columns = [str(c).strip() for c in table.columns]
    spec = task_spec(task)
    if spec.label_column:
        need = list(spec.listfile_columns)
        if any(c not in table.columns for c in need):
            raise ValueError(f"{path}: expected columns {','.join(need)} ({spec.data_dir} "
                             f"listfile); found {','.join(table.columns)}")
    else:
        if list(table.columns[:2]) != ["stay", "period_length"] or len(table.columns) < 3:
            raise ValueError(f"{path}: expected columns stay,period_length,<phenotype labels> "
                             f"(phenotyping listfile); found {','.join(table.columns[:4])}...")
        bad = ~(pd.to_numeric(table["period_length"], errors="coerce") > 0)
        if bad.any():
            raise ValueError(f"{path}: period_length must be a positive number of hours "
                             f"(row of stay {table['stay'][bad.idxmax()]!r})")
    if table["stay"].duplicated().any():
        raise ValueError(f"{path}: stay {table['stay'][table['stay'].duplicated()].iloc[0]!r} "
                         "is listed twice")
    return table.reset_index(drop=True)


def label_names(table: pd.DataFrame, task: str) -> tuple[str, ...]:
    spec = task_spec(task)
    if spec.label_column:
        return spec.label_names
    return tuple(table.columns[2:])


def labels(table: pd.DataFrame, task: str) -> np.ndarray:
    """[N, C] float32 label matrix of a listfile."""
    spec = task_spec(task)
    cols = [spec.label_column] if spec.label_column else list(table.columns[2:])
    return table[cols].to_numpy(dtype=np.float32).reshape(len(table), len(cols))


def _valset_subjects(path: Path) -> tuple[set[str], set[str]] | None:
    """(all listed subjects, validation subjects) of a benchmark `valset.csv`."""
    try:
        vs = pd.read_csv(path, header=None, names=["subject", "val"], dtype=str)
    except (OSError, ValueError, pd.errors.ParserError):
        return None
    flag = pd.to_numeric(vs["val"], errors="coerce").fillna(0).to_numpy() == 1
    return set(vs["subject"].str.strip()), set(vs["subject"][flag].str.strip())


def resolve_split(tdir: Path, task: str, split: str, *, seed: int = 0,
                  val_fraction: float = 0.15) -> SplitSpec:
    """Which listfile rows form `split`, using the benchmark's own validation split if present.

    Order of preference for train/val: `train_listfile.csv` + `val_listfile.csv` (task folder or
    `train/`), then a `valset.csv` of subject ids (task folder, its parent, or the benchmark's
    own in the data folder) that lists the subjects, then a seeded split by subject id.
    """
    if split not in ("train", "val", "test"):
        raise ValueError(f"unknown split {split!r}; expected train, val or test")
    if split == "test":
        for path in (tdir / "test" / "listfile.csv", tdir / "test_listfile.csv"):
            if path.is_file():
                return SplitSpec(read_listfile(path, task), tdir / "test",
                                 str(path.relative_to(tdir)), [path])
        raise FileNotFoundError(f"no test split: expected {tdir / 'test' / 'listfile.csv'}")

    for folder in (tdir, tdir / "train"):
        tr, va = folder / "train_listfile.csv", folder / "val_listfile.csv"
        if tr.is_file() and va.is_file():
            shared = set(read_listfile(tr, task)["stay"]) & set(read_listfile(va, task)["stay"])
            if shared:
                raise ValueError(f"{tr} and {va} share {len(shared)} stays (e.g. "
                                 f"{sorted(shared)[0]!r}): validation would leak into training")
            path = tr if split == "train" else va
            return SplitSpec(read_listfile(path, task), tdir / "train",
                             "train_listfile.csv/val_listfile.csv", [path])

    base_path = tdir / "train" / "listfile.csv"
    base = read_listfile(base_path, task)
    subjects = base["stay"].map(subject_of).to_numpy(dtype=str)
    for cand in (tdir / "valset.csv", tdir.parent / "valset.csv", benchmark_valset_path()):
        if not cand.is_file():
            continue
        parsed = _valset_subjects(cand)
        if parsed is None:
            continue
        listed, val = parsed
        if len(subjects) and np.isin(subjects, list(listed)).mean() >= VALSET_MIN_COVERAGE:
            mask = np.isin(subjects, list(val))
            keep = mask if split == "val" else ~mask
            return SplitSpec(base[keep].reset_index(drop=True), tdir / "train",
                             f"valset.csv ({cand})", [base_path, cand])
    strat = labels(base, task)[:, 0] if task_spec(task).binary else None
    mask = split_groups(subjects, val_fraction, seed, strat)
    keep = mask if split == "val" else ~mask
    return SplitSpec(base[keep].reset_index(drop=True), tdir / "train",
                     f"seeded split by subject id (seed={seed}, {val_fraction:g} val)",
                     [base_path])


# ---------------------------------------------------------------- timeseries


@dataclass
class ReadReport:
    """What reading a split's timeseries files found, per channel."""

    n_files: int
    n_rows: int
    invalid: np.ndarray  # [C] values that are not numbers / not categories: dropped
    dropped: np.ndarray  # [C] outside the outlier bounds: dropped
    clipped: np.ndarray  # [C] clipped to the valid bounds
    unknown_columns: list[str]
    rows_without_time: int = 0
    implausible: np.ndarray | None = None  # [C] not physiological: dropped
    rescaled: np.ndarray | None = None  # [C] a known scaling undone (pH x 100)

    def as_dict(self, fs: FeatureSet) -> dict[str, object]:
        ids = [v.id for v in fs.variables]
        return {
            "files": self.n_files,
            "rows": self.n_rows,
            "rows_without_time": self.rows_without_time,
            "unknown_columns": self.unknown_columns,
            "invalid": dict(zip(ids, self.invalid.tolist(), strict=True)),
            "implausible": dict(zip(ids, _counts(self.implausible, ids), strict=True)),
            "rescaled": dict(zip(ids, _counts(self.rescaled, ids), strict=True)),
            "dropped": dict(zip(ids, self.dropped.tolist(), strict=True)),
            "clipped": dict(zip(ids, self.clipped.tolist(), strict=True)),
        }


def _counts(a: np.ndarray | None, ids: list[str]) -> list[int]:
    return [0] * len(ids) if a is None else a.tolist()


def _split_file(data: bytes) -> tuple[bytes, bytes]:
    """(header line, body with one row per line and a final newline)."""
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    nl = data.find(b"\n")
    head, body = (data, b"") if nl < 0 else (data[:nl], data[nl + 1:])
    return head, _normalise_body(body)


def _normalise_body(body: bytes) -> bytes:
    """LF line ends, a final newline, no blank or whitespace-only lines: `pandas.read_csv`
    skips those, so they must not count as rows (a stay's rows would shift to the next)."""
    if b"\r" in body:
        body = body.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    if body and not body.endswith(b"\n"):
        body += b"\n"
    if body.startswith((b"\n", b" ", b"\t")) or any(
            s in body for s in (b"\n\n", b"\n ", b"\n\t")):  # a line may be blank
        kept = [line for line in body.split(b"\n") if line.strip()]
        body = b"\n".join(kept) + b"\n" if kept else b""
    return body


def _split_head(data: bytes) -> tuple[bytes, bytes | memoryview]:
    """`_split_file` with the body's normalisation left to `_join_bodies`, which checks a whole
    group at once: the body is a view when the file ends with a newline and its header line has
    no CR (then `_normalise_body` of the view is what `_split_file` would return)."""
    nl = data.find(b"\n")
    if nl >= 0 and data.endswith(b"\n") and b"\r" not in data[:nl]:
        return data[:nl], memoryview(data)[nl + 1:]
    return _split_file(data)


def _read_bytes(path: Path) -> bytes:
    """The whole file, read with plain system calls and no file object: a third of the cost
    of `open().read()` on 4,000 small files. Reads until end of file, so a short read (a
    network file system) loses nothing."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = [os.read(fd, _READ_SIZE)]
        while chunks[-1]:
            chunks.append(os.read(fd, _READ_SIZE))
        return chunks[0] if len(chunks) == 2 else b"".join(chunks)
    finally:
        os.close(fd)


#: Bytes asked for per read: more than most timeseries files hold, so one read and the one
#: that finds the end.
_READ_SIZE = 1 << 16
#: Bytes that start a line `_normalise_body` drops (blank or whitespace-led).
_BLANK_START = np.zeros(256, dtype=bool)
_BLANK_START[[ord("\n"), ord(" "), ord("\t")]] = True


def _join_bodies(bodies: list[bytes | memoryview]) -> tuple[bytes, np.ndarray]:
    """(the bodies joined, rows per body), each body normalised as `_split_file` does.

    One vectorised pass over the joined text finds whether any body could need it (a CR, or a
    line that is empty or starts with a space or tab); only then is every body normalised."""
    blob = b"".join(bodies)
    text = np.frombuffer(blob, dtype=np.uint8)
    nl = np.flatnonzero(text == ord("\n"))
    if b"\r" in blob or (len(nl) and (_BLANK_START[text[0]]
                                     or _BLANK_START[text[nl[:-1] + 1]].any())):
        bodies = [_normalise_body(bytes(b)) for b in bodies]
        blob = b"".join(bodies)
        nl = np.flatnonzero(np.frombuffer(blob, dtype=np.uint8) == ord("\n"))
    ends = np.cumsum([len(b) for b in bodies])
    return blob, np.diff(np.searchsorted(nl, ends), prepend=0)


def _channel_of(fs: FeatureSet) -> dict[str, int]:
    out: dict[str, int] = {}
    for i, v in enumerate(fs.variables):
        out[v.benchmark_name.lower()] = i
        out[v.id.lower()] = i
    return out


def read_timeseries(paths: Sequence[Path], fs: FeatureSet, *, progress: bool | None = None,
                    desc: str = "read") -> tuple[Observations, ReadReport]:
    """Observations of the given `*_timeseries.csv` files (stay i = paths[i]), cleaned.

    Ordered by (stay, time, row in file, column in file). Files that share a header are parsed
    together; the cells that hold a value are taken row by row (row-major), so when every file
    lists its rows in time order, as the benchmark writes them, no sort is needed.
    """
    invalid = np.zeros(fs.n_channels, dtype=np.int64)
    unknown: list[str] = []
    parts: list[tuple[np.ndarray, ...]] = []
    totals = {"rows": 0, "no_time": 0}

    def flush(groups: dict[bytes, tuple[list[int], list[bytes | memoryview]]]) -> None:
        for head, (stays, bodies) in groups.items():
            blob, counts = _join_bodies(bodies)
            cols = _parse_group(head, blob, fs, paths[stays[0]])
            if int(counts.sum()) != len(cols.hours):  # e.g. a quoted cell holding a newline
                raise ValueError(f"cannot tell the stay of each row in files like "
                                 f"{paths[stays[0]]}: {len(cols.hours)} rows parsed from "
                                 f"{int(counts.sum())} lines (a line break inside a cell?)")
            stay_of_row = np.repeat(np.asarray(stays, dtype=np.int64), counts)
            unknown.extend(u for u in cols.unknown if u not in unknown)
            np.add(invalid, cols.invalid, out=invalid)
            has_time = ~np.isnan(cols.hours)
            totals["no_time"] += int(len(has_time) - has_time.sum())
            # Row-major positions of the cells with a value: (row, column) in file order (a
            # contiguous copy of the transposed mask and flat gathers: half the cost of
            # scanning the transposed view and of a 2-D fancy index).
            present = np.ascontiguousarray((~np.isnan(cols.values) & has_time).T)
            row, col = np.divmod(np.flatnonzero(present), max(len(cols.channels), 1))
            parts.append((stay_of_row[row], cols.channels[col], cols.hours[row],
                          cols.values.reshape(-1)[col * len(cols.hours) + row],
                          row + totals["rows"]))
            totals["rows"] += len(cols.hours)
        groups.clear()

    # Parse in batches of about BATCH_BYTES so memory stays bounded on large datasets.
    pending: dict[bytes, tuple[list[int], list[bytes | memoryview]]] = {}
    size = 0
    for i, path in enumerate(tqdm(paths, desc=desc, unit="file", disable=_disable(progress),
                                  leave=False)):
        try:
            head, body = _split_head(_read_bytes(path))
        except FileNotFoundError:
            _raise_missing(paths)
            raise
        g = pending.setdefault(head.strip(), ([], []))
        g[0].append(i)
        g[1].append(body)
        size += len(body)
        if size >= BATCH_BYTES:
            flush(pending)
            size = 0
    flush(pending)

    if len(parts) == 1:
        stay, channel, time, value, row = parts[0]
    elif parts:
        stay, channel, time, value, row = (np.concatenate(a) for a in zip(*parts, strict=True))
    else:
        stay = channel = row = np.zeros(0, dtype=np.int64)
        time = value = np.zeros(0)
    if not in_stay_time_order(stay, time):
        order = np.lexsort((row, time, stay))  # stable: a row's cells keep their column order
        stay, channel, time, value = stay[order], channel[order], time[order], value[order]
    obs, rep = clean(Observations(stay, channel, time, value, len(paths)), fs)
    report = ReadReport(len(paths), totals["rows"], invalid, rep.dropped, rep.clipped, unknown,
                        totals["no_time"], rep.implausible, rep.rescaled)
    return obs, report


def _raise_missing(paths: Sequence[Path]) -> None:
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} timeseries file(s) named in the listfile are missing, e.g. "
            f"{missing[0]} (expected beside the listfile, as mimic3-benchmarks writes them)"
        )


@dataclass
class _Columns:
    """The parsed cells of files sharing one header."""

    hours: np.ndarray  # float64 [rows]; NaN where not a number
    channels: np.ndarray  # int64 [k]: the channel of each known column with a value, in file
    # order (a column without one is left out: nothing to take from it)
    values: np.ndarray  # float64 [k, rows]: numbers / category indices; NaN where missing
    invalid: np.ndarray  # int64 [C] per channel: cells present but not a number / category
    unknown: list[str]  # column names that are no channel


def _parse_group(head: bytes, blob: bytes, fs: FeatureSet, example: Path) -> _Columns:
    """Parse the joined bodies of files sharing one header in one call.

    pyarrow's CSV reader parses the columns of the feature set (numbers as float64, categories
    dictionary-encoded, so each distinct text is looked up once; other columns are not
    converted) on this thread. A group it rejects (a cell that is not a number, a row with
    another number of cells) is parsed by `pandas.read_csv` as text instead, converted column
    by column and its bad cells counted as invalid.
    """
    names = [n.strip().strip('"') for n in head.decode("utf-8-sig").split(",")]
    lower = [n.lower() for n in names]
    if "hours" not in lower:
        raise ValueError(f"{example}: expected a header starting with Hours,<channel names> "
                         f"(mimic3-benchmarks timeseries); found {head[:80]!r}")
    index = _channel_of(fs)
    known = [(i, index[low]) for i, low in enumerate(lower) if low != "hours" and low in index]
    unknown = [n for n, low in zip(names, lower, strict=True)
               if low != "hours" and low not in index]
    channels = np.array([ch for _, ch in known], dtype=np.int64)
    invalid = np.zeros(fs.n_channels, dtype=np.int64)
    if not blob:  # header-only files: no rows to parse
        return _Columns(np.zeros(0), channels[:0], np.zeros((0, 0)), invalid, unknown)
    hours_col = lower.index("hours")
    try:
        hours, values, filled, bad = _parse_with_arrow(blob, len(names), hours_col, known, fs)
    except pa.ArrowInvalid:
        hours, values, bad = _parse_with_pandas(blob, len(names), hours_col, known, fs, example)
        filled = list(range(len(known)))
    np.add.at(invalid, channels, bad)
    return _Columns(hours, channels[filled], values, invalid, unknown)


def _parse_with_arrow(blob: bytes, n_columns: int, hours_col: int, known: list[tuple[int, int]],
                      fs: FeatureSet) -> tuple[np.ndarray, np.ndarray, list[int], np.ndarray]:
    """(hours, values of the known columns with a cell filled, which those are, invalid cells
    per known column) of a well-formed group; raises `pyarrow.ArrowInvalid` otherwise. A cell
    read as NaN ("nan") is invalid, as it is on the text path."""
    cols = [f"c{i}" for i in range(n_columns)]
    types = {cols[hours_col]: pa.float64()}
    for i, ch in known:
        types[cols[i]] = _DICTIONARY if fs.variables[ch].is_categorical else pa.float64()
    table = pacsv.read_csv(
        pa.py_buffer(blob),
        read_options=pacsv.ReadOptions(column_names=cols, use_threads=False),
        convert_options=pacsv.ConvertOptions(column_types=types, include_columns=list(types),
                                             null_values=[""], strings_can_be_null=True,
                                             quoted_strings_can_be_null=True))
    hours = table.column(cols[hours_col]).to_numpy()
    columns = [table.column(cols[i]) for i, _ in known]
    filled = [j for j, c in enumerate(columns) if c.null_count < len(c)]  # others: no value
    values = np.empty((len(filled), table.num_rows))
    invalid = np.zeros(len(known), dtype=np.int64)
    for row, j in zip(values, filled, strict=True):
        column, var = columns[j], fs.variables[known[j][1]]
        if var.is_categorical:
            start = 0
            for chunk in column.chunks:
                row[start:start + len(chunk)] = _dictionary_indices(chunk, var)
                start += len(chunk)
        else:
            row[:] = column.to_numpy()
        invalid[j] = int(np.isnan(row).sum()) - column.null_count
    return hours, values, filled, invalid


def _parse_with_pandas(blob: bytes, n_columns: int, hours_col: int,
                       known: list[tuple[int, int]], fs: FeatureSet, example: Path
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hours, values, invalid) of a group pyarrow rejects: every cell as text, converted per
    column."""
    cols = [f"c{i}" for i in range(n_columns)]
    kw = dict(header=None, names=cols, keep_default_na=False, na_values=[""], index_col=False)
    try:
        df = pd.read_csv(io.BytesIO(blob), dtype=str, **kw)
    except pd.errors.ParserError as e:
        raise ValueError(f"cannot parse timeseries files like {example}: {e}") from e
    hours = pd.to_numeric(df[cols[hours_col]], errors="coerce").to_numpy(np.float64)
    values = np.empty((len(known), len(df)))
    invalid = np.zeros(len(known), dtype=np.int64)
    for j, (i, ch) in enumerate(known):
        s = df[cols[i]]
        if fs.variables[ch].is_categorical:
            s = s.astype("category")
            lut = _category_lut(s.cat.categories, fs.variables[ch])
            values[j] = lut[s.cat.codes.to_numpy()]
        else:
            values[j] = pd.to_numeric(s, errors="coerce").to_numpy(np.float64)
        invalid[j] = int((s.notna().to_numpy() & np.isnan(values[j])).sum())
    return hours, values, invalid


#: How pyarrow reads a categorical column: each distinct text stored once.
_DICTIONARY = pa.dictionary(pa.int32(), pa.string())


def _dictionary_indices(chunk: pa.DictionaryArray, var: Variable) -> np.ndarray | float:
    """Category index of each cell of one dictionary-encoded chunk (NaN: empty or no
    category of `var`)."""
    if chunk.null_count == len(chunk):
        return np.nan
    lut = _category_lut(chunk.dictionary.to_pylist(), var)
    return lut[chunk.indices.fill_null(-1).to_numpy()]


def _category_lut(texts: Sequence[object], var: Variable) -> np.ndarray:
    """Category index of each distinct text, and NaN last (for code -1, an empty cell): each
    text looked up once, stripped, NaN where it is no category of `var`."""
    lut = np.full(len(texts) + 1, np.nan)
    for k, text in enumerate(texts):
        with suppress(CategoryError):
            lut[k] = float(var.category_index(str(text).strip()))
    return lut


def read_demographics(path: Path, stays: Sequence[str]) -> np.ndarray:
    """[N, len(STATIC_FIELDS)] float64 from `demographics.csv`; NaN where absent."""
    out = np.full((len(stays), len(STATIC_FIELDS)), np.nan)
    if not path.is_file():
        return out
    demo = pd.read_csv(path, dtype={"stay": str})
    if "stay" not in demo.columns:
        raise ValueError(f"{path}: expected a `stay` column then {','.join(STATIC_FIELDS)}")
    demo = demo.drop_duplicates("stay", keep="last").set_index("stay").reindex(list(stays))
    for j, name in enumerate(STATIC_FIELDS):
        if name in demo.columns:
            out[:, j] = pd.to_numeric(demo[name], errors="coerce").to_numpy(np.float64)
    return out
