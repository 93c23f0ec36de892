"""events.csv text: fields are quoted exactly as Python's csv writer quotes them, also where the
quoting of ids and times is decided once per run instead of per row. The reference writes with
pandas (line terminator "\\n"), whose csv writer leaves a lone carriage return unquoted."""

from __future__ import annotations

import csv
import io

import duckdb
import pytest

from training.data.mimic3 import events as ev


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
