"""events.csv text: fields are quoted exactly as Python's csv writer quotes them, also where the
quoting of ids and times is decided once per run instead of per row. The reference writes with
pandas (line terminator "\\n"), whose csv writer leaves a lone carriage return unquoted."""

from __future__ import annotations

import csv
import gzip
import io
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from scehr.training.data.mimic3 import events as ev


def _text(rows: list[tuple], stays: list[tuple[str, str]]) -> str:
    con = duckdb.connect()
    con.execute("CREATE TABLE stays (sid BIGINT, hadm VARCHAR, icu VARCHAR)")
    con.executemany("INSERT INTO stays VALUES (1, ?, ?)", stays)
    con.execute("""CREATE TABLE ev (tbl INT, rn BIGINT, sid BIGINT, hadm VARCHAR, icu VARCHAR,
                   charttime VARCHAR, itemid BIGINT, value VARCHAR, uom VARCHAR)""")
    con.executemany("INSERT INTO ev VALUES (0, ?, 1, ?, ?, ?, ?, ?, ?)",
                    [(k, *r) for k, r in enumerate(rows)])
    con.execute(f"""CREATE TABLE pre AS SELECT sid, bool_or({ev._special('charttime')})
                    AS quoted_time FROM ev GROUP BY sid""")
    return b"".join(bytes(d) for _, d in ev.events_csv(con)).decode()


def _python(rows: list[tuple]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for r in rows:
        w.writerow(["1", *("" if x is None else x for x in r)])
    return buf.getvalue()


@pytest.mark.parametrize("hadm,icu,time", [
    ("100", "200", "2101-01-01 10:00:00"),
    ("1,00", "200", "2101-01-01 10:00:00"),
    ("100", '2"00', "2101-01-01\n10:00"),
    ("100", "200", "2101-01-01, 10:00"),
])
def test_events_csv_quotes_like_python(hadm: str, icu: str, time: str) -> None:
    rows = [(hadm, icu, time, 5, "1,5", "mm\nHg"),
            (hadm, icu, time, 8, "a\rb", "mm\rHg"),
            (hadm, icu, "2101-01-01 11:00:00", 6, 'a "b"', None),
            (hadm, icu, None, 7, "3", "")]
    assert _text(rows, [(hadm, icu)]) == _python(rows)


_RAW = ('row_id,subject_id,hadm_id,icustay_id,charttime,itemid,value,valueuom\n'
        '1,1,2,,2101-01-01 10:00:00,5,"1,5","mm\nHg"\n'
        '2,1,2,3,2101-01-01 10:00:00,6,"a\rb",x\n'
        '3,1,,3,,7,"",\n'
        '4,1,2,3,2101-01-01 11:00:00,8,"a ""b""",NA\n'
        '5,1,2,3,2101-01-01 12:00:00,9,None, y \n')


@pytest.mark.parametrize("crlf", [False, True])
@pytest.mark.parametrize("gz", [False, True])
def test_scan_reads_the_text_pandas_reads(tmp_path: Path, crlf: bool, gz: bool) -> None:
    """The scan's staged text equals what pandas reads (the reference reads with it): quoted
    separators, quotes and newlines, a quoted empty field missing as an empty one, CRLF ends,
    gzip, lower-case headers; rows in file order."""
    text = _RAW.replace("\n", "\r\n").replace("mm\r\nHg", "mm\nHg") if crlf else _RAW
    src = tmp_path / ("ev.csv.gz" if gz else "ev.csv")
    with (gzip.open(src, "wt", newline="") if gz else open(src, "w", newline="")) as f:
        f.write(text)
    ev.scan_table(src, tmp_path / "ev.parquet")
    got = duckdb.sql(f"SELECT * FROM '{tmp_path / 'ev.parquet'}'").fetchall()
    want = pd.read_csv(src, dtype=str, keep_default_na=False, na_values=[""])
    want.columns = want.columns.str.upper()
    want = want[ev.EVENT_COLUMNS].astype(object).where(want.notna(), None)
    assert got == list(want.itertuples(index=False, name=None))
    assert got[2][1] is None and got[2][5] is None  # "" and an empty field: both missing
