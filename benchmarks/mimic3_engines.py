"""DuckDB vs Polars on the extraction's size-dependent work: CHARTEVENTS as text -> parquet
(streaming), and a group-by over the result. Prints wall and CPU seconds per step, the load
average and the peak memory. (The extraction scans with Polars since this comparison.)

    python benchmarks/mimic3_extract.py --copies 14 --workdir /tmp/bench   # builds the copy
    python benchmarks/mimic3_engines.py /tmp/bench/mimic/CHARTEVENTS.csv
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Callable

import duckdb
import polars as pl

COLUMNS = ["SUBJECT_ID", "HADM_ID", "ICUSTAY_ID", "CHARTTIME", "ITEMID", "VALUE", "VALUEUOM"]


def timed(name: str, step: Callable[[], object]) -> None:
    wall, cpu = time.perf_counter(), time.process_time()
    step()
    print(f"{name:<34} wall {time.perf_counter() - wall:5.1f} s  "
          f"cpu {time.process_time() - cpu:5.1f} s", flush=True)


def main(path: str, tmp: str = "/tmp") -> None:
    con = duckdb.connect()
    con.execute("SET memory_limit = '2GB'")
    opts = "header = true, all_varchar = true, quote = '\"', escape = '\"'"
    duck, polars_out = f"{tmp}/engines_duckdb.parquet", f"{tmp}/engines_polars.parquet"
    timed("duckdb csv->parquet", lambda: con.execute(
        f"COPY (SELECT {', '.join(COLUMNS)} FROM read_csv('{path}', {opts})) "
        f"TO '{duck}' (FORMAT parquet)"))
    timed("polars csv->parquet (streaming)", lambda: pl.scan_csv(
        path, infer_schema=False).select(COLUMNS).sink_parquet(polars_out))
    timed("duckdb group by subject,itemid", lambda: con.execute(
        f"SELECT SUBJECT_ID, ITEMID, count(*), max(VALUE) FROM '{duck}' GROUP BY ALL"
    ).fetchall())
    timed("polars group by subject,itemid", lambda: pl.scan_parquet(polars_out).group_by(
        ["SUBJECT_ID", "ITEMID"]).agg(pl.len(), pl.col("VALUE").max()).collect(
        engine="streaming"))
    print(f"load average {os.getloadavg()}, peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10} MiB; duckdb "
          f"{duckdb.__version__}, polars {pl.__version__}")
    for p in (duck, polars_out):
        os.remove(p)


if __name__ == "__main__":
    main(*sys.argv[1:])
