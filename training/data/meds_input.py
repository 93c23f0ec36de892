"""MEDS (Medical Event Data Standard) -> the in-hospital-mortality layout (48 h windows).

A MEDS dataset is `data/**/*.parquet` (subject_id, time, code, numeric_value, text_value),
`metadata/subject_splits.parquet`, and optionally `metadata/codes.parquet` (each code's
description, `parent_codes`) and `metadata/dataset.json`; a task adds a label table (subject_id,
prediction_time, boolean_value). Each label row is one stay: the 48 hours before its prediction
time, in hours since the window's start (seconds / 60 / 60, as the benchmark computes them).

Codes become variables (`CodeMapper`): a declared code map first, then MIMIC item ids by the
benchmark's item map (`items="mimic"`; by default when `dataset.json` names a MIMIC dataset),
then LOINC codes, the code's own or its `parent_codes`. Each event is then read by the same row
rules as a JSON or FHIR payload (`scehr.schemas.ingest.read_columns`): units by the catalog
(the unit is the code's last `//` part, else the code map's or the item's assumed one), category
text by the catalog's aliases; a row a rule refuses is counted and left out, never written as a
missing value over a real one. Several values of one channel at one time keep the benchmark's
one (`same_time_pick`), whatever their order in the file. Tables are checked against the `meds`
package's schemas; the output is read by `scehr train` and `scehr score` like any converted
dataset.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from scehr.schemas.featureset import FEATURE_SETS, FeatureSet
from scehr.schemas.ingest import ObservationColumns, read_columns
from scehr.schemas.tensorize import Observations
from scehr.schemas.variables import by_loinc, loinc_index, lookup
from scehr.training.data.layout import TASK_DIRS
from scehr.training.data.meds_shards import SUBJECT, code_counts, iter_subjects, row_groups
from scehr.training.data.mimic3.items import item_unit_as_read
from scehr.training.data.writer import write_json, write_task_listfiles, write_timeseries

WINDOW_HOURS = 48.0
EPS = 1e-6
#: The project's splits, and the MEDS names that mean them by default.
OUR_SPLITS = ("train", "val", "test")
DEFAULT_SPLITS = {"train": "train", "tuning": "val", "held_out": "test"}
#: Code parts that stand for "no unit" in MEDS ETLs' codes.
NO_UNIT = {"", "UNK", "UNKNOWN", "NONE", "NULL", "NAN"}
#: The columns of the data shards the conversion reads.
MEDS_COLUMNS = ["subject_id", "time", "code", "numeric_value", "text_value"]
#: Whole subjects converted at a time: with a row group, the bound on the memory of a
#: conversion (`convert_meds`' `subjects_per_chunk`).
SUBJECTS_PER_CHUNK = 64
_ITEM = re.compile(r"^\d+$")
_NUMBER = re.compile(r"^\s*[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\s*$")


def parse_split_map(text: str) -> dict[str, str]:
    """`train=train,tuning=val,held_out=test` -> {MEDS split: train|val|test}."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, ours = part.partition("=")
        if not sep or ours.strip() not in OUR_SPLITS:
            raise ValueError(f"--split-map: {part!r} is not NAME=train|val|test")
        out[name.strip()] = ours.strip()
    return out


def read_code_map(path: Path) -> pd.DataFrame:
    """A declared code map: CSV with columns `code,variable` and optionally `unit` (the unit
    of the code's values where the code does not name one)."""
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = {"code", "variable"} - set(table.columns)
    if missing:
        raise ValueError(f"{path}: code map needs columns code,variable (missing "
                         f"{', '.join(sorted(missing))})")
    if "unit" not in table:
        table["unit"] = ""
    return table[["code", "variable", "unit"]]


def _validated(table: pa.Table, schema: Any, what: str) -> pa.Table:
    """`table` aligned to a `meds` schema; a ValueError naming the table otherwise."""
    try:
        return schema.align(table)
    except Exception as e:  # the meds package raises its own error types
        raise ValueError(f"{what} does not follow the MEDS schema: {e}") from e


def read_meds(meds_dir: Path) -> pa.Table:
    """Every data shard of a MEDS dataset, checked against `meds.DataSchema`."""
    import meds

    files = sorted((Path(meds_dir) / meds.data_subdirectory).rglob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no MEDS data under {Path(meds_dir) / meds.data_subdirectory} "
                                "(expected data/**/*.parquet)")
    return pa.concat_tables([_validated(pq.read_table(f), meds.DataSchema, str(f))
                             .select(MEDS_COLUMNS) for f in files])


def read_dataset_metadata(meds_dir: Path) -> dict[str, Any]:
    """`metadata/dataset.json`, checked against `meds.DatasetMetadataSchema` ({} if absent)."""
    import meds

    path = Path(meds_dir) / meds.dataset_metadata_filepath
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        meds.DatasetMetadataSchema.validate(data)
    except Exception as e:
        raise ValueError(f"{path} does not follow the MEDS dataset metadata schema: {e}") from e
    return data


def read_code_metadata(meds_dir: Path) -> pd.DataFrame:
    """`metadata/codes.parquet` (code, parent_codes and, where the ETL wrote one, unit);
    empty if absent."""
    import meds

    path = Path(meds_dir) / meds.code_metadata_filepath
    if not path.is_file():
        return pd.DataFrame({"code": [], "parent_codes": [], "unit": []})
    table = _validated(pq.read_table(path), meds.CodeMetadataSchema, str(path)).to_pandas()
    if "unit" not in table:
        table["unit"] = None
    return table[["code", "parent_codes", "unit"]]


@dataclass
class CodeMapper:
    """Code -> (variable id, unit) by the declared map, MIMIC item ids, then LOINC codes."""

    fs: FeatureSet
    code_map: pd.DataFrame | None = None
    item_map: pd.DataFrame | None = None
    code_metadata: pd.DataFrame = field(default_factory=lambda: read_code_metadata(Path("-")))

    def __post_init__(self) -> None:
        ids = {v.id for v in self.fs.variables}
        self._declared: dict[str, tuple[str, str | None]] = {}
        for code, var, unit in ([] if self.code_map is None else
                                self.code_map.itertuples(index=False)):
            vid = lookup(var).id
            if vid not in ids:
                raise ValueError(f"code map: {code} -> {var}, which feature set "
                                 f"{self.fs.name} lacks")
            self._declared[code] = (vid, unit if isinstance(unit, str) and unit else None)
        self._items = {} if self.item_map is None else {
            i: (v, u if isinstance(u, str) else None)
            for i, v, u in self.item_map.itertuples(index=False) if v in ids}
        self._loinc = loinc_index(self.fs.variables)
        meta = self.code_metadata
        self._parents = dict(zip(meta.code, meta.parent_codes, strict=True))
        self._units = {c: u for c, u in zip(meta.code, meta.unit, strict=True)
                       if isinstance(u, str) and u.strip().upper() not in NO_UNIT}

    def resolve(self, code: str) -> tuple[str, str | None] | None:
        """(variable id, unit or None) of a code, or None if no rule maps it.

        The unit is codes.parquet's, else the code's part after the stem that named the
        variable (`LAB//<itemid>//<unit>`, `LOINC/<code>//<unit>`; the last of three or more
        parts for a code declared whole), else the declared one."""
        parts = code.split("//")
        found, stem = None, len(parts)
        for k in range(len(parts), 0, -1):  # the code, then shorter `//` stems of it
            found, stem = self._declared.get("//".join(parts[:k])), k
            if found:
                break
        item = found is None and self.item_map is not None and len(parts) > 1 \
            and _ITEM.match(parts[1]) is not None
        if item:
            found, stem = self._items.get(parts[1]), 2
            if found is None:
                return None  # a MIMIC item the benchmark does not read
        if found is None:
            by_loinc = self._by_loinc(code)
            if by_loinc is None:
                return None
            found, stem = (by_loinc[0], None), by_loinc[1]
        unit = self._units.get(code)
        # the part after the stem; a code declared whole names its unit last, as ETLs write
        # `<kind>//<id>//<unit>`
        if unit is None and (len(parts) > stem or len(parts) >= 3) \
                and parts[-1].strip().upper() not in NO_UNIT:
            unit = parts[-1]
        unit = unit if unit is not None else found[1]
        return found[0], item_unit_as_read(found[0], unit) if item else unit

    def _by_loinc(self, code: str) -> tuple[str, int] | None:
        """The variable of a LOINC code (`LOINC/<code>` or `LOINC//<code>`), the code's own
        or a parent's, and the number of the code's parts that name it (the rest: a unit)."""
        parents = self._parents.get(code)
        own = len(code.split("//"))
        for n, c in enumerate([code, *([] if parents is None else list(parents))]):
            parts = c.split("//")
            head, value = parts[0].upper(), None
            if head == "LOINC" and len(parts) > 1:
                value, stem = parts[1], 2
            elif head.startswith("LOINC/"):
                value, stem = parts[0][len("LOINC/"):], 1
            var = None if value is None else by_loinc(value, self._loinc)
            if var is not None:
                return var.id, stem if n == 0 else min(own, 2)
        return None


def _benchmark_compares_text(fs: FeatureSet) -> np.ndarray:
    """Per channel: does the benchmark pick among same-time values by their text (see
    `same_time_pick`)."""
    from scehr.training.data.mimic3.events import CLEANED

    return np.array([v.benchmark_name not in CLEANED for v in fs.variables], dtype=bool)


def same_time_pick(channel: np.ndarray, time: np.ndarray, value: np.ndarray,
                   text: np.ndarray, by_text: np.ndarray) -> np.ndarray:
    """Indices of the values kept: one per (channel, time), the benchmark's, whatever the order.

    The benchmark keeps the largest value of a variable at one chart time. Its values are text
    until its cleaning step parses them: the variables it cleans (units, BP strings, categories
    of capillary refill) compare as numbers, the others, for a subject whose values are not all
    numbers, as the source text (`by_text[channel]`, `text` not None). Ties keep the first.
    """
    if len(channel) == 0:
        return np.zeros(0, dtype=np.int64)
    use_text = by_text[channel] & np.array([t is not None for t in text], dtype=bool)
    keys = [(c, t, 1, s) if u else (c, t, 0, v) for c, t, u, s, v in zip(
        channel.tolist(), time.tolist(), use_text.tolist(), text.tolist(), value.tolist(),
        strict=True)]
    best: dict[tuple[int, float], int] = {}
    for i, (c, t, kind, k) in enumerate(keys):
        j = best.get((c, t))
        if j is None or (kind, k) > (keys[j][2], keys[j][3]):
            best[(c, t)] = i
    return np.sort(np.fromiter(best.values(), np.int64, len(best)))


def convert_meds(meds_dir: Path, labels: Path, out: Path, *,
                 code_map: pd.DataFrame | Mapping[str, str] | None = None,
                 items: str = "auto", item_map: Path | None = None,
                 split_map: Mapping[str, str] | None = None,
                 fs: FeatureSet | None = None,
                 subjects_per_chunk: int = SUBJECTS_PER_CHUNK) -> dict[str, Any]:
    """Write `out/in-hospital-mortality/` from a MEDS dataset and a label table (or a folder
    of them, as ACES writes per shard).

    The shards are read by row groups, `subjects_per_chunk` whole subjects converted at a time
    (`meds_shards.iter_subjects`); the codes are counted in a first pass over the code column,
    so a dataset none of whose codes maps is refused before anything is written. Memory: a row
    group, a chunk's events and the label table, whatever the size of the dataset.

    `items`: "mimic" maps MIMIC item ids by `item_map` (default: the benchmark's, see
    `Resources`), "none" does not, "auto" does when `dataset.json` names a MIMIC dataset.
    `split_map`: MEDS split name -> train|val|test (default train/tuning/held_out).
    """
    if items not in ("auto", "mimic", "none"):
        raise ValueError(f"items: {items!r} is not auto, mimic or none")
    fs = fs or FEATURE_SETS["benchmark76-48h"]
    metadata = read_dataset_metadata(meds_dir)
    if isinstance(code_map, Mapping):
        code_map = pd.DataFrame({"code": list(code_map), "variable": list(code_map.values()),
                                 "unit": ""})
    use_items = items == "mimic" or (items == "auto" and "mimic" in str(
        metadata.get("dataset_name", "")).lower())
    mapper = CodeMapper(fs, code_map, _item_map(item_map) if use_items else None,
                        read_code_metadata(meds_dir))
    groups = row_groups(meds_dir)
    code_events = code_counts(groups)
    resolved = {c: r for c in code_events if (r := mapper.resolve(c)) is not None}
    if not resolved:
        codes = list(code_events)
        raise ValueError(
            f"no code of {meds_dir} maps to a variable of feature set {fs.name} ({len(codes)} "
            "codes; e.g. " + ", ".join(map(repr, codes[:5])) + "): declare them with "
            "--code-map, give LOINC parent codes in metadata/codes.parquet, or --items mimic "
            "for MIMIC item ids")
    lab = _with_splits(read_labels(labels), meds_dir, split_map or DEFAULT_SPLITS)
    counts: dict[str, Any] = {"labels": len(lab), "events_used": 0,
                              "codes_mapped": len(resolved),
                              "codes_ignored": len(code_events) - len(resolved),
                              "events_ignored": sum(n for c, n in code_events.items()
                                                    if c not in resolved),
                              "values_refused": Counter(), "same_time_values_dropped": 0}
    parts = {part: lab[(lab.split == "test") == (part == "test")].reset_index(drop=True)
             for part in ("train", "test")}
    seen: set[int] = set()
    for chunk in iter_subjects(groups, subjects_per_chunk, MEDS_COLUMNS):
        subjects = _new_subjects(chunk, seen)
        data = chunk.to_pandas()
        numeric_subjects = _all_numeric_subjects(data)
        events = data[data.code.isin(resolved)].groupby("subject_id")
        for part, rows in parts.items():
            rows = rows[rows.subject_id.isin(subjects)].reset_index(drop=True)
            obs = _observations(rows, events, resolved, numeric_subjects, fs, counts)
            _write_stays(out / TASK_DIRS["mortality"] / part, rows, obs, fs, counts)
    for part, rows in parts.items():  # labelled subjects without events: empty stays
        rows = rows[~rows.subject_id.isin(seen)].reset_index(drop=True)
        none = Observations(np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0), len(rows))
        _write_stays(out / TASK_DIRS["mortality"] / part, rows, none, fs, counts)
        write_stay_labels(out / TASK_DIRS["mortality"] / part, parts[part])
    train = pd.DataFrame({"stay": parts["train"].stay,
                          "y_true": parts["train"].boolean_value.astype(int)})
    test = pd.DataFrame({"stay": parts["test"].stay,
                         "y_true": parts["test"].boolean_value.astype(int)})
    val = (parts["train"].split == "val").to_numpy()
    write_task_listfiles(out / TASK_DIRS["mortality"], train, val, test)
    counts["values_refused"] = dict(sorted(counts["values_refused"].items()))  # any file order
    write_json(out / "provenance.json", {
        "source": "MEDS", "meds_dir": str(meds_dir),
        "dataset": {k: metadata.get(k) for k in ("dataset_name", "dataset_version",
                                                 "etl_name", "etl_version")},
        "mimic_items": use_items, "feature_set": {"name": fs.name}, **counts})
    return counts


def _new_subjects(chunk: pa.Table, seen: set[int]) -> list[int]:
    """The subjects of a chunk, added to `seen`; an error if one came before (MEDS keeps each
    subject's events together, in one shard, sorted by subject)."""
    subjects = np.unique(chunk[SUBJECT].to_numpy()).tolist()
    again = seen.intersection(subjects)
    if again:
        raise ValueError(f"subject {min(again)} has events in more than one place: MEDS data "
                         "shards hold each subject in one shard, sorted by subject_id")
    seen.update(subjects)
    return subjects


def _write_stays(split_dir: Path, rows: pd.DataFrame, obs: Observations, fs: FeatureSet,
                 counts: dict[str, Any]) -> None:
    """The stay files of `rows` (stay i = rows[i]), counting their events."""
    counts["events_used"] += len(obs)
    write_timeseries(split_dir, list(rows.stay), obs, fs, progress=False)


#: Label columns ACES writes with no value for a binary task; `meds.LabelSchema` refuses an
#: optional column full of nulls, so they are dropped before the check.
ACES_EMPTY = ("integer_value", "float_value", "categorical_value")


def _without_empty(table: pa.Table, columns: tuple[str, ...]) -> pa.Table:
    return table.drop_columns([c for c in columns if c in table.column_names
                               and table[c].null_count == len(table)])


def read_labels(path: Path) -> pd.DataFrame:
    """A MEDS label table, or a folder of them (ACES writes one per data shard), checked
    against `meds.LabelSchema`; only rows with a boolean label (ACES' other columns are
    allowed and ignored)."""
    import meds

    path = Path(path)
    files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
    if not files:
        raise FileNotFoundError(f"no label table (*.parquet) under {path}")
    lab = pd.concat([_validated(_without_empty(pq.read_table(f), ACES_EMPTY),
                                meds.LabelSchema, str(f)).to_pandas() for f in files],
                    ignore_index=True)
    missing = lab.boolean_value.isna()
    if missing.all():
        raise ValueError(f"{path}: no row has a boolean_value (the tasks here are binary)")
    return lab[~missing][["subject_id", "prediction_time", "boolean_value"]]


#: Beside each split folder's listfile: which MEDS label row each stay file is.
STAY_LABELS = "meds_labels.parquet"


def write_stay_labels(split_dir: Path, rows: pd.DataFrame) -> None:
    """`split_dir/meds_labels.parquet`: stay, subject_id, prediction_time, boolean_value, so
    that scores of the stays can be written back as MEDS predictions."""
    import meds

    split_dir.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(rows[["subject_id", "prediction_time", "boolean_value"]],
                                 preserve_index=False)
    table = meds.LabelSchema.align(table)
    table = table.append_column("stay", pa.array(rows.stay.tolist(), pa.string()))
    pq.write_table(table, split_dir / STAY_LABELS)


def _item_map(path: Path | None) -> pd.DataFrame:
    from scehr.training.data.mimic3.items import read_item_map
    from scehr.training.data.mimic3.sources import Resources

    return read_item_map(path or Resources.from_dir().itemid_map)


def _with_splits(lab: pd.DataFrame, meds_dir: Path, split_map: Mapping[str, str]
                 ) -> pd.DataFrame:
    """Labels in subject and time order, each named as a stay and given our split."""
    import meds

    splits = _validated(pq.read_table(Path(meds_dir) / meds.subject_splits_filepath),
                        meds.SubjectSplitSchema, "subject splits").to_pandas()
    lab = lab.sort_values(["subject_id", "prediction_time"], kind="stable").reset_index(drop=True)
    lab["stay"] = [f"{s}_episode{k}_timeseries.csv" for s, k in zip(
        lab.subject_id, lab.groupby("subject_id").cumcount() + 1, strict=True)]
    named = lab.subject_id.map(dict(zip(splits.subject_id, splits.split, strict=True)))
    if named.isna().any():
        raise ValueError(f"{int(named.isna().sum())} labelled subject(s) have no split in "
                         f"{meds.subject_splits_filepath}")
    unmapped = sorted(set(named) - set(split_map))
    if unmapped:
        raise ValueError(f"split name(s) {', '.join(map(repr, unmapped))} in "
                         f"{meds.subject_splits_filepath} are not mapped to train, val or "
                         "test: give --split-map NAME=train|val|test,... (default "
                         + ",".join(f"{k}={v}" for k, v in DEFAULT_SPLITS.items()) + ")")
    lab["split"] = named.map(split_map)
    return lab


def _is_number(text: Any) -> bool:
    return isinstance(text, str) and _NUMBER.match(text) is not None


def _all_numeric_subjects(data: pd.DataFrame) -> set[int]:
    """Subjects every one of whose events' text is a number (or absent): the benchmark read
    such a subject's values as numbers, any other's as text (`events.create_validated`)."""
    text = data.text_value
    bad = text.notna() & ~text.fillna("0").str.match(_NUMBER.pattern)
    return set(data.subject_id.unique().tolist()) - set(data.subject_id[bad].tolist())


def _observations(rows: pd.DataFrame, events: Any, rule: Mapping[str, tuple[str, str | None]],
                  numeric_subjects: set[int], fs: FeatureSet, counts: dict[str, Any]
                  ) -> Observations:
    """The events of each label's 48 h window, read by the row rules (stay i = rows[i])."""
    parts = []
    groups = events.groups
    by_text = _benchmark_compares_text(fs)
    categorical = {v.id for v in fs.variables if v.is_categorical}
    for i, (sid, t) in enumerate(zip(rows.subject_id, rows.prediction_time, strict=True)):
        if sid not in groups:
            continue
        ev = events.get_group(sid)
        start = t - pd.Timedelta(hours=WINDOW_HOURS)
        hours = (ev.time - start).dt.total_seconds().to_numpy() / 60.0 / 60.0
        keep = (hours > -EPS) & (hours < WINDOW_HOURS + EPS)
        ev, hours = ev[keep], hours[keep]
        pairs = [rule[c] for c in ev.code]
        variable = [v for v, _ in pairs]
        unit = [None if v in categorical else u for v, u in pairs]  # a category has none
        text = ev.text_value.tolist()
        value = [_value(v in categorical, s, n) for v, s, n in zip(
            variable, text, ev.numeric_value.tolist(), strict=True)]
        read = read_columns(ObservationColumns(variable, unit, hours, value), fs)
        counts["values_refused"].update(p.rule for p in read.problems)
        src = np.array([text[k] if isinstance(text[k], str) else None for k in read.source],
                       dtype=object)
        pick = same_time_pick(read.channel, read.time, read.value, src,
                              np.zeros_like(by_text) if sid in numeric_subjects else by_text)
        counts["same_time_values_dropped"] += len(read.channel) - len(pick)
        parts.append((np.full(len(pick), i), read.channel[pick], read.time[pick],
                      read.value[pick]))
    if not parts:
        return Observations(np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0), len(rows))
    stay, channel, time, value = (np.concatenate(x) for x in zip(*parts, strict=True))
    order = np.lexsort((channel, time, stay))
    return Observations(stay[order], channel[order], time[order], value[order], len(rows))


def _value(categorical: bool, text: Any, number: Any) -> float | str:
    """An event's value as a payload gives it: a category's text (else its number); for a
    continuous variable the source text where it is a plain number (MEDS stores
    `numeric_value` as float32), else `numeric_value`, else the text (which the number rule
    refuses)."""
    has_text = isinstance(text, str)
    has_number = number is not None and not (isinstance(number, float) and np.isnan(number))
    if categorical:
        return text if has_text else float(number) if has_number else ""
    if has_text and _is_number(text):
        return float(text)
    if has_number:
        return float(number)
    return text if has_text else ""
