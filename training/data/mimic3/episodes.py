"""Episode files (`episode{i}.csv`, `episode{i}_timeseries.csv`) and the four task folders.

The reference's `extract_episodes_from_subjects` (label file per ICU stay),
`create_in_hospital_mortality` (stays of >= 48 h, rows of the first 48 h),
`create_decompensation` and `create_length_of_stay` (rows within the stay, hourly samples:
`hourly`), `create_phenotyping` (rows within the stay, the 25 benchmark CCS groups) and
`split_train_val`.
Rows arrive as bytes made by DuckDB, one subject and stay at a time: memory holds one stay.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scehr.training.data.mimic3 import events as ev
from scehr.training.data.mimic3.filewriter import FileWriter
from scehr.training.data.mimic3.hourly import HOURLY_TASKS, HourlyTasks
from scehr.training.data.phenotypes import benchmark_groups, code_to_group

IHM_HOURS = 48.0
EPS = 1e-6
#: The reference's seed for shuffling the train listfiles.
LISTFILE_SEED = 49297
#: The task folders, as the reference names them.
TASK_DIRS = ("in-hospital-mortality", *HOURLY_TASKS, "phenotyping")
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


class TaskWriter:
    """Task files per episode and the listfile rows of both tasks (nothing else is kept)."""

    def __init__(self, out: Path, cohort: Any, definitions: dict[str, Any],
                 test_set: set[str], files: FileWriter, *,
                 no_phenotypes: set[int] | None = None) -> None:
        self.files = files  # the task files are written on its threads
        self.groups = list(benchmark_groups(definitions))
        code_group = code_to_group(definitions)
        self.pheno: dict[int, set[str]] = {}
        dx = cohort.diagnoses
        for icu, code, use in zip(dx.ICUSTAY_ID, dx.ICD9_CODE, dx.USE_IN_BENCHMARK, strict=True):
            # the reference tests `if row['USE_IN_BENCHMARK']` (NA is true there); a code of
            # no CCS group (only MIMIC-IV's ICD10: codes) would stop it: skipped here
            if (use is pd.NA or use) and code in code_group:
                self.pheno.setdefault(int(icu), set()).add(code_group[code])
        self.out, self.test_set = out, test_set
        self.no_phenotypes = no_phenotypes or set()  # admissions (MIMIC-IV coded in ICD-10)
        self.ihm: dict[str, list[str]] = {"train": [], "test": []}
        self.ph: dict[str, list[tuple[str, float, list[int]]]] = {"train": [], "test": []}
        self.hourly = HourlyTasks(out, LISTFILE_SEED)
        for d in TASK_DIRS:
            for split in ("train", "test"):
                (out / d / split).mkdir(parents=True, exist_ok=True)

    def add(self, sid: int, icu: str, stay: Any, file: str, head: bytes, hours: np.ndarray,
            rows: bytes, starts: np.ndarray) -> None:
        """One episode: rows with -eps < hours < 48 + eps (mortality, stays of >= 48 h) or
        < LOS + eps (decompensation, length of stay, phenotyping); hours ascend, so each is one
        slice of `rows`."""
        if stay.LOS is None or stay.LOS != stay.LOS:
            return
        los = 24.0 * float(stay.LOS)
        split = "test" if str(sid) in self.test_set else "train"
        name = f"{sid}_{file}"
        lo = int(np.searchsorted(hours, -EPS, side="right"))
        if los >= IHM_HOURS - EPS:
            hi = int(np.searchsorted(hours, IHM_HOURS + EPS, side="left"))
            if hi > lo:
                self.files.write(self.out / "in-hospital-mortality" / split / name, head,
                                 rows[starts[lo]:starts[hi]])
                self.ihm[split].append(f"{name},{int(stay.MORTALITY):d}")
        hi = int(np.searchsorted(hours, los + EPS, side="left"))
        if hi == lo:
            return  # no row within the stay
        within = rows[starts[lo]:starts[hi]]
        for task in HOURLY_TASKS:
            self.files.write(self.out / task / split / name, head, within)
        self.hourly.add(split, name, los, float(hours[lo]), stay)
        if int(stay.HADM_ID) not in self.no_phenotypes:
            self.files.write(self.out / "phenotyping" / split / name, head, within)
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
        return summary | self.hourly.finish(val_set)


def write_episodes(con: Any, cohort: Any, variables: list[str], subject_dirs: dict[int, Path],
                   tasks: TaskWriter) -> int:
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
    first = ev.first_values(con, ("Weight", "Height"))
    head = (",".join(["Hours", *variables]) + "\n").encode()
    pieces: list[tuple[np.ndarray, bytes, np.ndarray]] = []
    cur: tuple[int, str] | None = None
    n = 0

    def flush() -> None:
        nonlocal n
        if cur is None:
            return
        sid, icu = cur
        hours = np.concatenate([h for h, _, _ in pieces])
        rows = b"".join(r for _, r, _ in pieces)
        starts = np.concatenate([[0], np.cumsum(np.concatenate([ln for _, _, ln in pieces]))])
        i = order[icu]
        d = subject_dirs[sid]
        tasks.files.write(d / f"episode{i}_timeseries.csv", head, rows)
        n += 1
        s = by_icu.loc[icu]
        labels = None
        if int(icu) in has_dx:
            dx = flags.get(int(icu), set())
            labels = [icu, str(_ethnicity(s.ETHNICITY)), str(GENDER.get(s.GENDER or "", 3)),
                      _num(s.AGE), first[icu]["Height"], first[icu]["Weight"], _num(s.LOS),
                      str(int(s.MORTALITY))]
            labels += ["1" if c in dx else "0" for c in DIAGNOSIS_LABELS]
            tasks.add(sid, icu, s, f"episode{i}_timeseries.csv", head, hours, rows, starts)
        text = _episode_header() + "\n" + (",".join(labels) + "\n" if labels else "")
        tasks.files.write(d / f"episode{i}.csv", text.encode())

    for sid, icu, hours, data, offsets in ev.episodes(con, variables):
        if (sid, icu) != cur:
            flush()
            cur, pieces = (sid, icu), []
        pieces.append((hours, bytes(data[offsets[0]:offsets[-1]]), np.diff(offsets)))
    flush()
    return n


def _write(path: Path, head: str, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + "".join(ln + "\n" for ln in lines))
