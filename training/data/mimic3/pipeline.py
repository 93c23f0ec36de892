"""`extract_mimic3`: raw MIMIC-III -> `OUT/root`, `OUT/in-hospital-mortality`, `OUT/phenotyping`.

Steps are idempotent: each run rewrites its outputs from scratch, and the one expensive step,
the scan of the event tables, is kept in `OUT/.mimic3-work/` (one parquet file per table,
written under a temporary name and renamed when complete) so that a run that was stopped
resumes after the tables it had finished. Delete that folder to rescan.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from training.data.mimic3 import events as ev
from training.data.mimic3.sources import Resources, read_subject_set
from training.data.mimic3.subjects import (
    read_cohort,
    write_root_tables,
    write_subject_tables,
)
from training.data.phenotypes import benchmark_groups, code_to_group, load_ccs_definitions

IHM_HOURS = 48.0
EPS = 1e-6
#: The reference's seed for shuffling the train listfiles.
LISTFILE_SEED = 49297
WORK_DIR = ".mimic3-work"
ETHNICITY = {"ASIAN": 1, "BLACK": 2, "CARIBBEAN ISLAND": 2, "HISPANIC": 3, "SOUTH AMERICAN": 3,
             "WHITE": 4, "MIDDLE EASTERN": 4, "PORTUGUESE": 4, "AMERICAN INDIAN": 0,
             "NATIVE HAWAIIAN": 0, "UNABLE TO OBTAIN": 0, "PATIENT DECLINED TO ANSWER": 0,
             "UNKNOWN": 0, "OTHER": 0, "": 0}
GENDER = {"F": 1, "M": 2, "OTHER": 3, "": 0}
#: The 128 ICD-9 codes of the reference's per-episode diagnosis columns, in its order.
DIAGNOSIS_LABELS = (
    "4019", "4280", "41401", "42731", "25000", "5849", "2724", "51881", "53081", "5990", "2720",
    "2859", "2449", "486", "2762", "2851", "496", "V5861", "99592", "311", "0389", "5859", "5070",
    "40390", "3051", "412", "V4581", "2761", "41071", "2875", "4240", "V1582", "V4582", "V5867",
    "4241", "40391", "78552", "5119", "42789", "32723", "49390", "9971", "2767", "2760", "2749",
    "4168", "5180", "45829", "4589", "73300", "5845", "78039", "5856", "4271", "4254", "4111",
    "V1251", "30000", "3572", "60000", "27800", "41400", "2768", "4439", "27651", "V4501",
    "27652", "99811", "431", "28521", "2930", "7907", "E8798", "5789", "79902", "V4986", "V103",
    "42832", "E8788", "00845", "5715", "99591", "07054", "42833", "4275", "49121", "V1046",
    "2948", "70703", "2809", "5712", "27801", "42732", "99812", "4139", "3004", "2639", "42822",
    "25060", "V1254", "42823", "28529", "E8782", "30500", "78791", "78551", "E8889", "78820",
    "34590", "2800", "99859", "V667", "E8497", "79092", "5723", "3485", "5601", "25040", "570",
    "71590", "2869", "2763", "5770", "V5865", "99662", "28860", "36201", "56210",
)

Progress = Callable[[str], None]


def read_itemid_map(path: Path) -> pd.DataFrame:
    """The benchmark's itemid -> variable rows in use (LEVEL2 set, COUNT > 0, STATUS ready)."""
    m = pd.read_csv(path, dtype=str, keep_default_na=False)
    m = m[(m.LEVEL2 != "") & (m.COUNT.astype(int) > 0) & (m.STATUS == "ready")]
    return pd.DataFrame({"ITEMID": m.ITEMID.astype(int), "VARIABLE": m.LEVEL2,
                         "MIMIC_LABEL": m["MIMIC LABEL"]})


def _num(x: Any) -> str:
    """A number as pandas writes it (repr of the float; missing -> empty)."""
    if x is None or (isinstance(x, float) and x != x):
        return ""
    return repr(float(x)) if isinstance(x, float) else str(x)


def _ethnicity(s: str | None) -> int:
    key = (s or "").replace(" OR ", "/").split(" - ")[0].split("/")[0]
    return ETHNICITY.get(key, ETHNICITY["OTHER"])


def _episode_header() -> str:
    return ",".join(["Icustay", "Ethnicity", "Gender", "Age", "Height", "Weight",
                     "Length of Stay", "Mortality"] + [f"Diagnosis {d}" for d in DIAGNOSIS_LABELS])


def _diagnosis_flags(dx: pd.DataFrame) -> dict[int, set[str]]:
    """Per ICU stay, the reference's diagnosis columns that are 1.

    The reference reads a subject's diagnoses.csv with type inference: when every code of the
    subject is all digits the codes become integers, match none of its string labels, and all
    128 columns are 0. That is reproduced, since the columns are part of its output.
    """
    out: dict[int, set[str]] = {}
    for _sid, part in dx.groupby("SUBJECT_ID", sort=False):
        if part.ICD9_CODE.str.fullmatch(r"[+-]?\d+").all():
            continue
        for icu, codes in part.groupby("ICUSTAY_ID"):
            out[int(icu)] = set(codes.ICD9_CODE)
    return out


def extract(mimic_dir: Path, out: Path, *, resources: Resources | None = None,
            memory_limit: str = "2GB", threads: int | None = None,
            progress: Progress = print) -> dict[str, Any]:
    """Run every step; returns counts (also written to `OUT/provenance.json`)."""
    t0 = time.perf_counter()
    res = resources or Resources.from_dir()
    mimic_dir, out = Path(mimic_dir), Path(out)
    root = out / "root"
    work = out / WORK_DIR
    for d in (root, out / "in-hospital-mortality", out / "phenotyping"):
        shutil.rmtree(d, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)

    progress("cohort: stays, admissions, patients, diagnoses")
    definitions = load_ccs_definitions(res.ccs_definitions)
    cohort = read_cohort(mimic_dir, definitions)
    write_root_tables(cohort, root)
    test_set = read_subject_set(res.testset)
    subjects = [int(s) for s in cohort.stays.SUBJECT_ID.unique()]
    subject_dirs = {s: root / ("test" if str(s) in test_set else "train") / str(s)
                    for s in subjects}
    write_subject_tables(cohort, subject_dirs)

    con = ev.connect(work, memory_limit, threads)
    stage = []
    for table in ev.EVENT_TABLES:
        path = work / f"{table.lower()}.parquet"
        if path.is_file():
            progress(f"scan {table}: reusing {path}")
        else:
            progress(f"scan {table} ...")
            ts = time.perf_counter()
            ev.scan_table(con, mimic_dir, table, path)
            progress(f"scan {table}: {time.perf_counter() - ts:.1f} s")
        stage.append(path)

    progress("validate events")
    validation = ev.create_validated(con, stage, cohort.stays)
    header = ",".join(ev.EVENT_COLUMNS) + "\n"
    for sid, lines in ev.events_csv_lines(con):
        (subject_dirs[sid] / "events.csv").write_text(header + "\n".join(lines) + "\n")
    for d in subject_dirs.values():
        if not (d / "events.csv").exists():
            (d / "events.csv").write_text(header)

    progress("episodes and tasks: clean, pivot, split by ICU stay")
    variables = ev.create_timeseries(con, read_itemid_map(res.itemid_map))
    tasks = _Tasks(out, cohort, definitions, test_set)
    n_episodes = _write_episodes(con, cohort, variables, subject_dirs, tasks)
    summary = tasks.finish(read_subject_set(res.valset))
    progress(f"{n_episodes} episodes; " + "; ".join(
        f"{t}: {v['train']} train, {v['test']} test stays" for t, v in summary.items()))
    prov = {"source": str(mimic_dir), "cohort": cohort.counts, "validation": validation,
            "episodes": n_episodes, "tasks": summary, "wall_seconds": time.perf_counter() - t0}
    (out / "provenance.json").write_text(json.dumps(prov, indent=2) + "\n")
    return prov


class _Tasks:
    """Listfile rows of both tasks, filled episode by episode (nothing else is kept)."""

    def __init__(self, out: Path, cohort: Any, definitions: dict[str, Any],
                 test_set: set[str]) -> None:
        self.groups = list(benchmark_groups(definitions))
        code_group = code_to_group(definitions)
        self.pheno: dict[int, set[str]] = {}
        dx = cohort.diagnoses
        for icu, code, use in zip(dx.ICUSTAY_ID, dx.ICD9_CODE, dx.USE_IN_BENCHMARK, strict=True):
            if use is pd.NA or use:  # the reference tests `if row['USE_IN_BENCHMARK']`
                self.pheno.setdefault(int(icu), set()).add(code_group[code])
        self.out, self.test_set = out, test_set
        self.ihm: dict[str, list[str]] = {"train": [], "test": []}
        self.ph: dict[str, list[tuple[str, float, list[int]]]] = {"train": [], "test": []}

    def add(self, sid: int, icu: str, stay: Any, file: str, head: str,
            items: list[tuple[float, str]]) -> None:
        """The reference's create_in_hospital_mortality / create_phenotyping for one episode."""
        if stay.LOS is None or stay.LOS != stay.LOS:
            return
        los = 24.0 * float(stay.LOS)
        split = "test" if str(sid) in self.test_set else "train"
        name = f"{sid}_{file}"
        if los >= IHM_HOURS - EPS:
            lines = [ln for h, ln in items if -EPS < h < IHM_HOURS + EPS]
            if lines:
                _write(self.out / "in-hospital-mortality" / split / name, head, lines)
                self.ihm[split].append(f"{name},{int(stay.MORTALITY):d}")
        lines = [ln for h, ln in items if -EPS < h < los + EPS]
        if lines:
            _write(self.out / "phenotyping" / split / name, head, lines)
            have = self.pheno.get(int(icu), set())
            self.ph[split].append((name, los, [int(g in have) for g in self.groups]))

    def finish(self, val_set: set[str]) -> dict[str, Any]:
        """Listfiles, then the reference's split_train_val (train/val/test_listfile.csv)."""
        summary = {}
        rng = random.Random(LISTFILE_SEED)
        ph = {k: [f"{x},{t:.6f},{','.join(map(str, y))}" for x, t, y in sorted(v)]
              for k, v in self.ph.items()}
        for task, header, rows in (
                ("in-hospital-mortality", "stay,y_true",
                 {k: sorted(v) for k, v in self.ihm.items()}),
                ("phenotyping", "stay,period_length," + ",".join(self.groups), ph)):
            tdir = self.out / task
            for split in ("test", "train"):
                lines = rows[split]
                if task == "in-hospital-mortality" and split == "train":
                    rng.shuffle(lines)  # as the reference (whose input order is the file system's)
                _write(tdir / split / "listfile.csv", header + "\n", lines)
            train = rows["train"]
            _write(tdir / "train_listfile.csv", header + "\n",
                   [x for x in train if x[:x.find("_")] not in val_set])
            _write(tdir / "val_listfile.csv", header + "\n",
                   [x for x in train if x[:x.find("_")] in val_set])
            shutil.copy(tdir / "test" / "listfile.csv", tdir / "test_listfile.csv")
            summary[task] = {k: len(v) for k, v in rows.items()}
        return summary


def _write_episodes(con: Any, cohort: Any, variables: list[str], subject_dirs: dict[int, Path],
                    tasks: _Tasks) -> int:
    """Episode files per subject, and each episode's task files; returns the episode count."""
    stays = cohort.stays
    flags = _diagnosis_flags(cohort.diagnoses)
    has_dx = set(cohort.diagnoses.ICUSTAY_ID.astype(int))
    order = {}
    for _sid, part in stays.groupby("SUBJECT_ID", sort=False):
        part = part.sort_values(["INTIME", "OUTTIME"], kind="stable")
        for i, icu in enumerate(part.ICUSTAY_ID, start=1):
            order[str(icu)] = i
    by_icu = stays.set_index(stays.ICUSTAY_ID.astype(str))
    ts_header = ",".join(["Hours", *variables]) + "\n"
    col = {v: i for i, v in enumerate(variables)}
    n = 0
    for sid, rows in ev.episode_rows(con, variables):
        d = subject_dirs[sid]
        per: dict[str, list[tuple[float, str]]] = {}
        for icu, h, line in rows:
            per.setdefault(icu, []).append((h, line))
        for icu, items in per.items():
            i = order[icu]
            file = f"episode{i}_timeseries.csv"
            text = [(h, f"{h!r},{line}") for h, line in items]
            _write(d / file, ts_header, [t for _, t in text])
            n += 1
            s = by_icu.loc[icu]
            labels = None
            if int(icu) in has_dx:
                weight = _first(items, col["Weight"])
                height = _first(items, col["Height"])
                dx = flags.get(int(icu), set())
                labels = [icu, str(_ethnicity(s.ETHNICITY)), str(GENDER.get(s.GENDER or "", 3)),
                          _num(s.AGE), height, weight, _num(s.LOS), str(int(s.MORTALITY))]
                labels += ["1" if c in dx else "0" for c in DIAGNOSIS_LABELS]
                tasks.add(sid, icu, s, file, ts_header, text)
            _write(d / f"episode{i}.csv", _episode_header() + "\n",
                   [",".join(labels)] if labels else [])
    return n


def _first(items: list[tuple[float, str]], column: int) -> str:
    """The first non-empty value of a column (rows in time order), as the reference's
    get_first_valid_from_timeseries (variables hold no commas, so a split is exact)."""
    for _, line in items:
        f = line.split(",")[column]
        if f:
            return f
    return ""


def _write(path: Path, head: str, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + "".join(ln + "\n" for ln in lines))
