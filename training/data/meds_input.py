"""MEDS (Medical Event Data Standard) -> the in-hospital-mortality layout (48 h windows).

A MEDS dataset is `data/**/*.parquet` (subject_id, time, code, numeric_value, text_value),
`metadata/subject_splits.parquet` (train / tuning / held_out) and, for a task, a label table
(subject_id, prediction_time, boolean_value). Each label row is one stay: the 48 hours before
its prediction time, in hours since the window's start (seconds / 60 / 60, as the benchmark
computes them). Codes become variables through a declared code map (CSV `code,variable`,
the variable by id or benchmark name); the default map is the catalog's LOINC codes written
`LOINC/<code>`. Codes the map does not name are counted and ignored. Tables are checked
against the `meds` package's schemas; the output is read by `scehr train` and `scehr score`
like any converted dataset.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from scehr.schemas.featureset import FEATURE_SETS, FeatureSet
from scehr.schemas.tensorize import Observations
from scehr.schemas.variables import CategoryError, lookup
from scehr.training.data.layout import TASK_DIRS
from scehr.training.data.writer import write_json, write_task_listfiles, write_timeseries

WINDOW_HOURS = 48.0
EPS = 1e-6
SPLITS = {"train": "train", "tuning": "val", "held_out": "test"}


def default_code_map(fs: FeatureSet) -> dict[str, str]:
    """`LOINC/<code>` -> variable id, for the feature set's variables that have a LOINC code."""
    return {f"LOINC/{v.loinc}": v.id for v in fs.variables if getattr(v, "loinc", None)}


def read_code_map(path: Path) -> dict[str, str]:
    """A declared code map: CSV with columns `code,variable`."""
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = {"code", "variable"} - set(table.columns)
    if missing:
        raise ValueError(f"{path}: code map needs columns code,variable (missing "
                         f"{', '.join(sorted(missing))})")
    return dict(zip(table.code, table.variable, strict=True))


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
                             for f in files])


def convert_meds(meds_dir: Path, labels: Path, out: Path, *,
                 code_map: Mapping[str, str] | None = None,
                 fs: FeatureSet | None = None) -> dict[str, Any]:
    """Write `out/in-hospital-mortality/` from a MEDS dataset and a label table."""
    import meds

    fs = fs or FEATURE_SETS["benchmark76-48h"]
    channel_of = {v.id: i for i, v in enumerate(fs.variables)}
    cmap = dict(code_map) if code_map is not None else default_code_map(fs)
    code_channel = {}
    for code, var in cmap.items():
        vid = lookup(var).id
        if vid not in channel_of:
            raise ValueError(f"code map: {code} -> {var}, which feature set {fs.name} lacks")
        code_channel[code] = channel_of[vid]
    data = read_meds(meds_dir).to_pandas()
    lab = _validated(pq.read_table(labels), meds.LabelSchema, str(labels)).to_pandas()
    splits = _validated(pq.read_table(Path(meds_dir) / meds.subject_splits_filepath),
                        meds.SubjectSplitSchema, "subject splits").to_pandas()
    split_of = dict(zip(splits.subject_id, splits.split.map(SPLITS), strict=True))
    lab = lab.sort_values(["subject_id", "prediction_time"], kind="stable").reset_index(drop=True)
    lab["stay"] = [f"{s}_{k}_timeseries.csv" for s, k in zip(
        lab.subject_id, lab.groupby("subject_id").cumcount() + 1, strict=True)]
    lab["split"] = lab.subject_id.map(split_of)
    if lab.split.isna().any():
        raise ValueError(f"{int(lab.split.isna().sum())} labelled subject(s) have no split in "
                         f"{meds.subject_splits_filepath}")
    ch = data.code.map(code_channel)
    ignored = data.code[ch.isna()].value_counts()
    data = data[ch.notna()].assign(channel=ch[ch.notna()].astype(np.int64))
    events = data.groupby("subject_id")
    counts = {"labels": len(lab), "events_used": 0, "codes_ignored": ignored.to_dict()}
    for part in ("train", "test"):
        rows = lab[(lab.split == "test") == (part == "test")].reset_index(drop=True)
        obs = _observations(rows, events, fs)
        counts["events_used"] += len(obs)
        write_timeseries(out / TASK_DIRS["mortality"] / part, list(rows.stay), obs, fs,
                         progress=False)
        table = pd.DataFrame({"stay": rows.stay, "y_true": rows.boolean_value.astype(int)})
        if part == "train":
            train, val = table, (rows.split == "val").to_numpy()
        else:
            test = table
    write_task_listfiles(out / TASK_DIRS["mortality"], train, val, test)
    write_json(out / "provenance.json", {"source": "MEDS", "meds_dir": str(meds_dir),
                                         "feature_set": {"name": fs.name}, **counts})
    return counts


def _observations(rows: pd.DataFrame, events: Any, fs: FeatureSet) -> Observations:
    """The events of each label's 48 h window as `Observations` (stay i = rows[i])."""
    parts = []
    groups = events.groups
    for i, (sid, t) in enumerate(zip(rows.subject_id, rows.prediction_time, strict=True)):
        if sid not in groups:
            continue
        ev = events.get_group(sid)
        start = t - pd.Timedelta(hours=WINDOW_HOURS)
        seconds = (ev.time - start).dt.total_seconds().to_numpy()
        hours = seconds / 60.0 / 60.0
        keep = (hours > -EPS) & (hours < WINDOW_HOURS + EPS)
        ev, hours = ev[keep], hours[keep]
        value = np.empty(len(ev))
        for k, (c, num, text) in enumerate(zip(ev.channel, ev.numeric_value, ev.text_value,
                                               strict=True)):
            var = fs.variables[c]
            if var.is_categorical:
                try:
                    value[k] = var.category_index(text if isinstance(text, str) else num)
                except CategoryError:
                    value[k] = np.nan
            else:
                value[k] = np.nan if num is None else float(num)
        parts.append((np.full(len(ev), i), ev.channel.to_numpy(), hours, value))
    if not parts:
        return Observations(np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0), len(rows))
    stay, channel, time, value = (np.concatenate(x) for x in zip(*parts, strict=True))
    order = np.lexsort((channel, time, stay))
    return Observations(stay[order], channel[order], time[order], value[order], len(rows))
