"""`extract`: raw MIMIC-III -> `OUT/root` and the four task folders (`episodes.TASK_DIRS`).

Steps are idempotent: each run rewrites its outputs from scratch, and the one expensive step,
the scan of the event tables, is kept in `OUT/.mimic3-work/` (one parquet file per table,
written under a temporary name and renamed when complete) so that a run that was stopped
resumes after the tables it had finished. Delete that folder to rescan. The scan starts
first and runs while the cohort is read, so an error in the small tables is raised once the
table being scanned is done (its parquet is kept for the next run).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd

from scehr.training.data.mimic3 import events as ev
from scehr.training.data.mimic3 import mimic4
from scehr.training.data.mimic3.episodes import TASK_DIRS, TaskWriter, write_episodes
from scehr.training.data.mimic3.filewriter import FileWriter
from scehr.training.data.mimic3.mimic4 import table_file, write_mimic3_view
from scehr.training.data.mimic3.sources import Resources, read_subject_set, table_path
from scehr.training.data.mimic3.subjects import read_cohort, write_root_tables, write_subject_tables
from scehr.training.data.phenotypes import load_ccs_definitions

WORK_DIR = ".mimic3-work"
Progress = Callable[[str], None]


def read_itemid_map(path: Path) -> pd.DataFrame:
    """The benchmark's itemid -> variable rows in use (LEVEL2 set, COUNT > 0, STATUS ready)."""
    m = pd.read_csv(path, dtype=str, keep_default_na=False)
    m = m[(m.LEVEL2 != "") & (m.COUNT.astype(int) > 0) & (m.STATUS == "ready")]
    return pd.DataFrame({"ITEMID": m.ITEMID.astype(int), "VARIABLE": m.LEVEL2,
                         "MIMIC_LABEL": m["MIMIC LABEL"]})


def extract(mimic_dir: Path, out: Path, *, resources: Resources | None = None,
            memory_limit: str = "2GB", threads: int | None = None, schema: str = "mimic3",
            progress: Progress = print) -> dict[str, Any]:
    """Run every step; returns counts (also written to `OUT/provenance.json`).

    `schema` "mimic4": `mimic_dir` is a MIMIC-IV root (hosp/, icu/), see `mimic4`.
    """
    t0 = time.perf_counter()
    res = resources or Resources.from_dir()
    mimic_dir, out = Path(mimic_dir), Path(out)
    root = out / "root"
    work = out / WORK_DIR
    for d in (root, *(out / t for t in TASK_DIRS)):
        shutil.rmtree(d, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)

    small, no_phenotypes = mimic_dir, set()
    if schema == "mimic3":
        events: dict[str, tuple[Path, str | None]] = {
            t: (table_path(mimic_dir, t), "ICUSTAY_ID") for t in ev.EVENT_TABLES}
    elif schema == "mimic4":
        progress("MIMIC-IV: hosp/ and icu/ tables in MIMIC-III's shape")
        small = work / "mimic4-as-mimic3"
        no_phenotypes = write_mimic3_view(mimic_dir, small)
        events = {t: (table_file(mimic_dir, f), icu)
                  for t, (f, icu) in mimic4.EVENT_FILES.items()}
    else:
        raise ValueError(f"schema must be mimic3 or mimic4, not {schema!r}")
    # Three lanes share the two cores: the scan (Polars) runs while the cohort's tables are
    # read and written; then the events.csv text streams to the writer while a second DuckDB
    # cursor cleans and pivots the timeseries and writes the episodes (each lane alone keeps
    # about one core busy; the file writer's threads overlap both).
    with FileWriter() as files, ThreadPoolExecutor(1, thread_name_prefix="mimic3") as lane:
        scans = lane.submit(lambda: [_scan(t, *events[t], work, progress)
                                     for t in ev.EVENT_TABLES])
        progress("cohort: stays, admissions, patients, diagnoses")
        definitions = load_ccs_definitions(res.ccs_definitions)
        cohort = read_cohort(small, definitions)
        write_root_tables(cohort, root)
        test_set = read_subject_set(res.testset)
        subjects = [int(s) for s in cohort.stays.SUBJECT_ID.unique()]
        subject_dirs = {s: root / ("test" if str(s) in test_set else "train") / str(s)
                        for s in subjects}
        write_subject_tables(cohort, subject_dirs, files)
        stage = scans.result()
        con = ev.connect(work, memory_limit, threads, progress_bar=sys.stderr.isatty())
        progress("validate events")
        validation = ev.create_validated(con, stage, cohort.stays)
        tasks = TaskWriter(out, cohort, definitions, test_set, files,
                           no_phenotypes=no_phenotypes)

        def timeseries_and_episodes(cur: Any) -> int:
            variables = ev.create_timeseries(cur, read_itemid_map(res.itemid_map))
            progress("episodes and tasks: split by ICU stay")
            return write_episodes(cur, cohort, variables, subject_dirs, tasks)

        episodes = lane.submit(timeseries_and_episodes, con.cursor())
        progress("write events.csv; clean, pivot and write the episodes alongside")
        _write_events(con, subject_dirs, files)
        n_episodes = episodes.result()
    summary = tasks.finish(read_subject_set(res.valset))
    progress(f"{n_episodes} episodes; " + "; ".join(
        f"{t}: {v['train']} train, {v['test']} test stays" for t, v in summary.items()))
    prov = {"source": str(mimic_dir), "schema": schema,
            "admissions_left_out_of_phenotyping_icd10": len(no_phenotypes),
            "cohort": cohort.counts, "validation": validation,
            "episodes": n_episodes, "tasks": summary, "wall_seconds": time.perf_counter() - t0}
    (out / "provenance.json").write_text(json.dumps(prov, indent=2) + "\n")
    return prov


def _scan(table: str, source: Path, icu_column: str | None, work: Path,
          progress: Progress) -> Path:
    """The staging parquet of one event table, reused when a previous run completed it."""
    path = work / f"{table.lower()}.parquet"
    if path.is_file():
        progress(f"scan {table}: reusing {path}")
        return path
    progress(f"scan {table} ...")
    ts = time.perf_counter()
    ev.scan_table(source, path, icu_column)
    progress(f"scan {table}: {time.perf_counter() - ts:.1f} s")
    return path


def _write_events(con: Any, subject_dirs: dict[int, Path], files: FileWriter) -> None:
    """Each subject's `events.csv` (the header alone for a subject without events)."""
    header = (",".join(ev.EVENT_COLUMNS) + "\n").encode()
    cur: int | None = None
    pieces: list[memoryview] = []
    done: set[int] = set()
    for sid, data in ev.events_csv(con):
        if sid != cur:
            if cur is not None:
                files.write(subject_dirs[cur] / "events.csv", header, *pieces)
                done.add(cur)
            cur, pieces = sid, []
        pieces.append(data)
    if cur is not None:
        files.write(subject_dirs[cur] / "events.csv", header, *pieces)
        done.add(cur)
    for sid, d in subject_dirs.items():
        if sid not in done:
            files.write(d / "events.csv", header)
