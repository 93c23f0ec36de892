"""Events out of core: scan the event tables once, validate, clean, pivot to episodes (DuckDB).

Memory is bounded by DuckDB's `memory_limit` (sorts and joins spill to `temp_directory`) plus
one subject's rows in Python while its files are written: it does not grow with the size of
CHARTEVENTS. The reference's rules, as SQL:

- scan (`extract_subjects`): every row of CHARTEVENTS, LABEVENTS and OUTPUTEVENTS of a kept
  subject, in file order, as text;
- validate (`validate_events`): drop rows without an admission or whose admission is not a kept
  stay's; fill a missing ICU stay from the admission's; drop rows naming another ICU stay;
- episodes (`extract_episodes_from_subjects`): itemid -> variable (`itemid_to_variable_map.csv`,
  STATUS ready), the benchmark's value cleaning (`CLEAN_SQL`), one value per variable and chart
  time (the largest, as the reference's sort keeps the last), one row per chart time, and per ICU
  stay the rows of that stay or charted between its in- and out-time, in hours since in-time.

Text is written as the reference's pandas writes it: a subject whose values are all numbers had
them parsed as floats (written `86.0`), else values stay the strings of the source.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa

from scehr.training.data.mimic3.sources import PANDAS1_NA, header

EVENT_TABLES: tuple[str, ...] = ("CHARTEVENTS", "LABEVENTS", "OUTPUTEVENTS")
EVENT_COLUMNS = ["SUBJECT_ID", "HADM_ID", "ICUSTAY_ID", "CHARTTIME", "ITEMID", "VALUE", "VALUEUOM"]
#: The 17 variables in the column order of the episode files (Python's sorted order).
NUMBER_RE = r"(\d+(\.\d*)?|\.\d+)"


def connect(work: Path, memory_limit: str, threads: int | None, *,
            progress_bar: bool = False) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection whose memory is capped and which spills to `work/tmp`."""
    (work / "tmp").mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    con.execute(f"SET enable_progress_bar = {str(progress_bar).lower()}")
    con.execute(f"SET memory_limit = {_quote(memory_limit)}")
    con.execute(f"SET temp_directory = {_quote(work / 'tmp')}")
    con.execute("SET preserve_insertion_order = true")  # the scan keeps each table's row order
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    return con


def _quote(value: object) -> str:
    """A SQL string literal (paths and settings may hold quotes)."""
    return "'" + str(value).replace("'", "''") + "'"


def _sql_list(items: list[str] | tuple[str, ...]) -> str:
    return ", ".join(_quote(s) for s in items)


def _na(col: str) -> str:
    return f"CASE WHEN {col} IN ({_sql_list(PANDAS1_NA)}) THEN NULL ELSE {col} END"


def scan_table(path: Path, out: Path, icu_column: str | None = "ICUSTAY_ID") -> None:
    """One event table's columns the benchmark reads -> `out` (parquet, text, file order).

    No filter here: a filtering join may reorder rows, and the reference writes each subject's
    events in file order. Parquet keeps the order (`file_row_number`) and is a fraction of the
    CSV's size; the kept subjects are selected when it is read. `icu_column` names the ICU
    stay column (MIMIC-IV: STAY_ID; None where the table has none).

    Polars' streaming reader parses the CSV with half of DuckDB's CPU time and the same text
    (plain or gzip, LF or CRLF, quoted newlines; an empty field, quoted or not, is missing as
    pandas reads it), in bounded memory; it keeps the file's row order.
    """
    cols = header(path)
    missing = [c for c in EVENT_COLUMNS if c not in cols and c != "ICUSTAY_ID"]
    if missing:
        raise ValueError(f"{path}: column(s) {', '.join(missing)} missing")
    icu = (pl.col(icu_column).alias("ICUSTAY_ID") if icu_column in cols
           else pl.lit(None, dtype=pl.String).alias("ICUSTAY_ID"))
    tmp = out.with_suffix(".partial")
    (pl.scan_csv(path, infer_schema=False, new_columns=cols, quote_char='"', null_values=[""])
     .select("SUBJECT_ID", "HADM_ID", icu, "CHARTTIME", "ITEMID", "VALUE", "VALUEUOM")
     .sink_parquet(tmp, compression="zstd", maintain_order=True))
    tmp.replace(out)


def _special(expr: str) -> str:
    """SQL: does `expr` hold a character that makes the reference's csv writer quote the field.

    pandas writes with line terminator "\\n", and Python's writer quotes only the delimiter, the
    quote and the terminator's characters: a carriage return alone is written unquoted."""
    return "(" + " OR ".join(
        f"contains({expr}, {c})" for c in ("','", "'\"'", "chr(10)")) + ")"


def csv_field(expr: str, *, plain: bool = False) -> str:
    """SQL for a CSV field as Python's csv writer quotes it (QUOTE_MINIMAL); NULL -> empty.

    `plain`: the caller knows no value of the column needs quoting, so none is checked."""
    if plain:
        return f"coalesce({expr}, '')"
    special = _special(expr)
    return (f"CASE WHEN {expr} IS NULL THEN '' WHEN {special} "
            f"THEN '\"' || replace({expr}, '\"', '\"\"') || '\"' ELSE {expr} END")


def _csv_line(fields: list[str]) -> str:
    """SQL for one CSV line of non-NULL `fields`, ended by a newline: one `concat`, which
    builds the string once, where a chain of `||` builds one per field."""
    return "concat(" + ", ',', ".join(fields) + ", chr(10))"


def create_validated(con: duckdb.DuckDBPyConnection, stage: list[Path],
                     stays: pd.DataFrame) -> dict[str, int]:
    """View `ev`: the validated events with their events.csv text; returns the reference's
    validation counts. One pass materialises the kept subjects' rows (table `j`, spilled to
    disk beyond the memory limit) with a status per row; everything after reads it."""
    st = stays[["SUBJECT_ID", "HADM_ID", "ICUSTAY_ID", "INTIME", "OUTTIME"]].copy()
    con.register("stays_df", st)
    con.execute("""CREATE OR REPLACE TABLE stays AS SELECT SUBJECT_ID::BIGINT AS sid,
        HADM_ID::VARCHAR AS hadm, ICUSTAY_ID::VARCHAR AS icu,
        INTIME::TIMESTAMP AS intime, OUTTIME::TIMESTAMP AS outtime FROM stays_df""")
    con.unregister("stays_df")
    raw = " UNION ALL ".join(
        f"""SELECT {k} AS tbl, file_row_number AS rn, SUBJECT_ID::BIGINT AS sid,
                   {_na('HADM_ID')} AS hadm, {_na('ICUSTAY_ID')} AS icu, CHARTTIME AS charttime,
                   ITEMID::BIGINT AS itemid, {_na('VALUE')} AS value, {_na('VALUEUOM')} AS uom
            FROM read_parquet({_quote(p)}, file_row_number = true)
            WHERE SUBJECT_ID::BIGINT IN (SELECT sid FROM stays)"""
        for k, p in enumerate(stage))
    # status: 0 kept, 1 no admission, 2 admission not a kept stay's, 3 another ICU stay
    con.execute(f"""CREATE OR REPLACE TABLE j AS
        SELECT r.tbl, r.rn, r.sid, r.hadm, r.icu IS NULL AS no_icu, s.icu AS stay_icu,
               r.charttime, r.itemid, r.value, r.uom,
               CASE WHEN r.hadm IS NULL THEN 1 WHEN s.icu IS NULL THEN 2
                    WHEN r.icu IS NOT NULL AND r.icu <> s.icu THEN 3 ELSE 0 END::TINYINT
                   AS status
        FROM ({raw}) r LEFT JOIN stays s ON r.sid = s.sid AND r.hadm = s.hadm""")
    # how pandas typed the VALUE column of each subject's events.csv before validation;
    # `kept_numeric`: the same over the kept rows (status 0), for how the episode step typed
    # them (see `create_timeseries`), in this pass rather than a second one over `ev`
    con.execute(f"""CREATE OR REPLACE TABLE pre AS SELECT sid,
        bool_and(value IS NULL OR TRY_CAST(value AS DOUBLE) IS NOT NULL) AS numeric,
        bool_and(value IS NULL OR TRY_CAST(value AS DOUBLE) IS NOT NULL) FILTER (status = 0)
            AS kept_numeric,
        bool_and(value IS NOT NULL AND regexp_full_match(value, '[+-]?[0-9]+')) AS integer,
        bool_or({_special('charttime')}) AS quoted_time
        FROM j GROUP BY sid""")
    c = con.execute("""SELECT count(*), count(*) FILTER (status = 1),
        count(*) FILTER (status = 2), count(*) FILTER (status IN (0, 3) AND no_icu),
        count(*) FILTER (status = 3) FROM j""").fetchone()
    assert c is not None
    con.execute("""CREATE OR REPLACE VIEW ev AS
        SELECT j.tbl, j.rn, j.sid, j.hadm, j.stay_icu AS icu, j.charttime, j.itemid, j.uom,
               CASE WHEN p.integer THEN CAST(CAST(j.value AS BIGINT) AS VARCHAR)
                    WHEN p.numeric THEN CAST(CAST(j.value AS DOUBLE) AS VARCHAR)
                    ELSE j.value END AS value
        FROM j JOIN pre p USING (sid) WHERE j.status = 0""")
    return {"n_events": c[0], "empty_hadm": c[1], "no_hadm_in_stay": c[2], "no_icustay": c[3],
            "recovered": c[3], "could_not_recover": 0, "icustay_missing_in_stays": c[4]}


def events_csv(con: duckdb.DuckDBPyConnection, batch: int = 500_000
               ) -> Iterator[tuple[int, memoryview]]:
    """(subject, bytes of its events.csv rows) in subject order, rows in source order; a
    subject may come in several pieces. The text is made by DuckDB; Python only slices it.

    A kept row's admission and ICU stay are its stay's, so whether they need quoting is
    decided once from the small `stays` table, and for chart times from the per-subject
    summary `pre`: the per-row check remains only for VALUE and VALUEUOM."""
    ids = con.execute(f"SELECT coalesce(bool_or({_special('hadm')} OR {_special('icu')}), false) "
                      "FROM stays").fetchall()[0]
    times = con.execute("SELECT coalesce(bool_or(quoted_time), false) FROM pre").fetchall()[0]
    line = _csv_line([
        "CAST(sid AS VARCHAR)", csv_field("hadm", plain=not ids[0]),
        csv_field("icu", plain=not ids[0]), csv_field("charttime", plain=not times[0]),
        "CAST(itemid AS VARCHAR)", csv_field("value"), csv_field("uom")])
    reader = con.sql(f"SELECT sid, {line} AS line FROM ev "
                     "ORDER BY sid, tbl, rn").to_arrow_reader(batch)
    for rb in reader:
        sids = rb.column(0).to_numpy()
        data, offsets = _text(rb.column(1))
        cuts = [0, *(np.flatnonzero(sids[1:] != sids[:-1]) + 1).tolist(), len(sids)]
        for a, b in itertools.pairwise(cuts):
            yield int(sids[a]), data[offsets[a]:offsets[b]]


def _text(col: pa.Array) -> tuple[memoryview, np.ndarray]:
    """The character data and row offsets of an Arrow string column (no copy)."""
    col = col.cast(pa.large_string()) if col.type == pa.string_view() else col
    width = np.int64 if pa.types.is_large_string(col.type) else np.int32
    _, off, data = col.buffers()
    offsets = np.frombuffer(off, dtype=width)[col.offset:col.offset + len(col) + 1]
    return memoryview(data), offsets.astype(np.int64)


CLEAN_SQL = """
CASE variable
  WHEN 'Capillary refill rate' THEN
    CASE WHEN s IN ('Normal <3 secs', 'Brisk') THEN 0.0::DOUBLE
         WHEN s IN ('Abnormal >3 secs', 'Delayed') THEN 1.0::DOUBLE END
  WHEN 'Systolic blood pressure' THEN
    CASE WHEN contains(s, '/') THEN TRY_CAST(regexp_extract(s, '^(\\d+)/(\\d+)$', 1) AS DOUBLE)
         ELSE d END
  WHEN 'Diastolic blood pressure' THEN
    CASE WHEN contains(s, '/') THEN TRY_CAST(regexp_extract(s, '^(\\d+)/(\\d+)$', 2) AS DOUBLE)
         ELSE d END
  WHEN 'Fraction inspired oxygen' THEN
    CASE WHEN contains(lower(coalesce(uom, '')), 'torr') THEN d ELSE d / 100.0::DOUBLE END
  WHEN 'Oxygen saturation' THEN
    CASE WHEN NOT numeric AND NOT regexp_full_match(s, '(\\d+(\\.\\d*)?|\\.\\d+)') THEN NULL
         WHEN d <= 1 THEN d * 100.0::DOUBLE ELSE d END
  WHEN 'Glucose' THEN
    CASE WHEN NOT numeric AND NOT regexp_full_match(s, '(\\d+(\\.\\d*)?|\\.\\d+)') THEN NULL
         ELSE d END
  WHEN 'pH' THEN
    CASE WHEN NOT numeric AND NOT regexp_full_match(s, '(\\d+(\\.\\d*)?|\\.\\d+)') THEN NULL
         ELSE d END
  WHEN 'Temperature' THEN
    CASE WHEN d >= 79 THEN (d - 32.0::DOUBLE) * 5.0::DOUBLE / 9.0::DOUBLE ELSE d END
  WHEN 'Weight' THEN
    CASE WHEN contains(lower(coalesce(uom, '')), 'oz') OR contains(lower(label), 'oz')
           THEN d / 16.0::DOUBLE * 0.453592::DOUBLE
         WHEN contains(lower(coalesce(uom, '')), 'lb') OR contains(lower(label), 'lb')
           THEN d * 0.453592::DOUBLE
         ELSE d END
  WHEN 'Height' THEN
    CASE WHEN contains(lower(coalesce(uom, '')), 'in') OR contains(lower(label), 'in')
           THEN round_even(d * 2.54::DOUBLE, 0) ELSE d END
END"""
CLEANED = ("Capillary refill rate", "Systolic blood pressure", "Diastolic blood pressure",
           "Fraction inspired oxygen", "Oxygen saturation", "Glucose", "pH", "Temperature",
           "Weight", "Height")


def create_timeseries(con: duckdb.DuckDBPyConnection, var_map: pd.DataFrame) -> list[str]:
    """Table `ts`: one row per subject and chart time (and ICU stay), a text column per
    variable; returns the variables in file column order."""
    con.register("var_map_df", var_map)
    con.execute("""CREATE OR REPLACE TABLE var_map AS
        SELECT ITEMID::BIGINT AS itemid, VARIABLE AS variable, MIMIC_LABEL AS label
        FROM var_map_df""")
    con.unregister("var_map_df")
    variables = sorted(var_map.VARIABLE.unique())
    # how pandas typed VALUE when the episode step re-read the validated events.csv: numeric
    # if every value before validation was (`ev` then holds numbers' text), else if every
    # kept one is
    con.execute("""CREATE OR REPLACE TABLE post AS SELECT sid,
        numeric OR coalesce(kept_numeric, false) AS numeric FROM pre""")
    cleaned = _sql_list(CLEANED)
    con.execute(f"""CREATE OR REPLACE TABLE clean AS
        WITH m AS (
            SELECT e.sid, e.icu, e.charttime::TIMESTAMP AS t, m.variable, m.label, e.uom,
                   e.value AS s, TRY_CAST(e.value AS DOUBLE) AS d, p.numeric
            FROM ev e JOIN var_map m USING (itemid) JOIN post p USING (sid)
            WHERE e.value IS NOT NULL),
        c AS (
            SELECT sid, icu, t, variable,
                   CASE WHEN variable IN ({cleaned}) THEN {CLEAN_SQL}
                        WHEN numeric THEN d END AS num,
                   CASE WHEN variable IN ({cleaned}) OR numeric THEN NULL ELSE s END AS str
            FROM m)
        SELECT * FROM c WHERE num IS NOT NULL OR str IS NOT NULL""")
    pivot = ",\n".join(
        f"max(txt) FILTER (variable = '{v}') AS \"{v}\"" for v in variables)
    con.execute(f"""CREATE OR REPLACE TABLE ts AS
        WITH last AS (
            SELECT sid, t, variable, coalesce(str, CAST(num AS VARCHAR)) AS txt,
                   row_number() OVER (PARTITION BY sid, t, variable
                                      ORDER BY num DESC NULLS LAST, str DESC NULLS LAST) AS k
            FROM clean),
        wide AS (SELECT sid, t, {pivot} FROM last WHERE k = 1 GROUP BY sid, t),
        meta AS (SELECT DISTINCT sid, t, icu FROM clean)
        SELECT m.icu, w.* FROM wide w JOIN meta m USING (sid, t)""")
    con.execute("DROP TABLE clean")
    return variables


#: Rows of each ICU stay's episode: the subject's rows of that stay or charted between its in-
#: and out-time (so a row may belong to two stays), hours since in-time as the reference
#: computes them (seconds / 60 / 60).
_EPISODE_ROWS = """
    SELECT ts.*, st.icu AS stay,
           date_diff('second', st.intime, ts.t) / 60.0::DOUBLE / 60.0::DOUBLE AS hours
    FROM ts JOIN stays st ON ts.sid = st.sid
         AND (ts.icu = st.icu OR ts.t BETWEEN st.intime AND st.outtime)"""


def episodes(con: duckdb.DuckDBPyConnection, variables: list[str], batch: int = 500_000
             ) -> Iterator[tuple[int, str, np.ndarray, memoryview, np.ndarray]]:
    """Per subject and ICU stay (in subject order): the stay, the hours of its rows (ascending),
    the bytes of its timeseries rows and their byte offsets (row k is
    data[offsets[k]:offsets[k+1]]). A stay's rows may come in several pieces."""
    line = _csv_line(["CAST(hours AS VARCHAR)", *(csv_field(f'e."{v}"') for v in variables)])
    sql = f"""
        WITH e AS ({_EPISODE_ROWS})
        SELECT sid, stay, hours, {line} AS line
        FROM e ORDER BY sid, stay, hours"""
    for rb in con.sql(sql).to_arrow_reader(batch):
        sids = rb.column(0).to_numpy()
        icus = rb.column(1).to_pylist()
        hours = rb.column(2).to_numpy()
        data, offsets = _text(rb.column(3))
        change = (sids[1:] != sids[:-1]) | np.array([a != b for a, b in itertools.pairwise(icus)],
                                                    dtype=bool)
        cuts = [0, *(np.flatnonzero(change) + 1).tolist(), len(sids)]
        for a, b in itertools.pairwise(cuts):
            yield int(sids[a]), icus[a], hours[a:b], data, offsets[a:b + 1]


def first_values(con: duckdb.DuckDBPyConnection, variables: tuple[str, ...]
                 ) -> dict[str, dict[str, str]]:
    """Per ICU stay, the first value (by hours) of each of `variables` in its episode, as the
    reference's get_first_valid_from_timeseries (Weight, Height for the episode file)."""
    cols = ", ".join(f'arg_min(e."{v}", hours) FILTER (e."{v}" IS NOT NULL) AS "{v}"'
                     for v in variables)
    rows = con.execute(f"""
        WITH e AS ({_EPISODE_ROWS})
        SELECT stay, {cols} FROM e GROUP BY stay""").fetchall()
    return {r[0]: {v: r[k + 1] or "" for k, v in enumerate(variables)} for r in rows}
