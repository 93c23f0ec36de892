"""CPU of each DuckDB query of `extract-mimic3` after the scan, one at a time, in process.

    python benchmarks/mimic3_extract_queries.py MIMIC_DIR OUT

OUT is the output folder of an earlier `scehr data extract-mimic3 MIMIC_DIR OUT` (its staged
scan in `OUT/.mimic3-work/` is read; nothing is written but DuckDB's spill files). The queries
run in sequence on one cursor, without the overlap of a real run and without writing files, so
each step's user and system seconds (all threads of the process), page faults and the load
average are its own: the figures to compare when a query changes, on a machine shared with other
work where wall times are not.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import loadavg  # noqa: E402

from scehr.training.data.mimic3 import events as ev  # noqa: E402
from scehr.training.data.mimic3.pipeline import WORK_DIR, read_itemid_map  # noqa: E402
from scehr.training.data.mimic3.sources import Resources  # noqa: E402
from scehr.training.data.mimic3.subjects import read_cohort  # noqa: E402
from scehr.training.data.phenotypes import load_ccs_definitions  # noqa: E402


def timed(name: str, step: Callable[[], Any]) -> Any:
    r0, w = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    out = step()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    print(f"{time.perf_counter() - w:7.2f} {r1.ru_utime - r0.ru_utime:7.2f} "
          f"{r1.ru_stime - r0.ru_stime:7.2f} {r1.ru_minflt - r0.ru_minflt:9d}  {name}", flush=True)
    return out


def drain(rows: Any) -> int:
    return sum(1 for _ in rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mimic_dir", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--memory-limit", default="2GB")
    args = ap.parse_args()
    work = args.out / WORK_DIR
    stage = [work / f"{t.lower()}.parquet" for t in ev.EVENT_TABLES]
    absent = [str(p) for p in stage if not p.is_file()]
    if absent:
        raise SystemExit(f"no staged scan: {', '.join(absent)} (run extract-mimic3 first)")
    res = Resources.from_dir()
    cohort = read_cohort(args.mimic_dir, load_ccs_definitions(res.ccs_definitions))
    con = ev.connect(work, args.memory_limit, None)
    load0 = loadavg()
    print(f"{'wall s':>7} {'user s':>7} {'sys s':>7} {'faults':>9}  step")
    timed("validate (tables j, pre)", lambda: ev.create_validated(con, stage, cohort.stays))
    timed("events.csv text, sorted", lambda: drain(ev.events_csv(con)))
    variables = timed("clean and pivot the timeseries",
                      lambda: ev.create_timeseries(con, read_itemid_map(res.itemid_map)))
    timed("episode rows, sorted", lambda: drain(ev.episodes(con, variables)))
    timed("first weight and height", lambda: ev.first_values(con, ("Weight", "Height")))
    print(f"load average before {load0}, after {loadavg()} ({os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
