"""What the service answers for each stay of a converted dataset: `scehr score`, read back.

Evaluation must see exactly what is served: the abstention of a stay below the model's data
minimum, the risk, its interval and the alert. The code that decides them is the service's
(`scehr.service.pipeline`), which training may not import (tests/test_architecture.py). So this
module runs the product's own offline scoring command, `scehr score`, in a child process on
the dataset's split folders and reads its output rows: the rows a hospital's batch job gets,
so `scehr evaluate` and `scehr score` can never disagree on a stay. It runs as served (the
abstentions and their reasons), with `--allow-insufficient` (the risk every stay would get with
the minimum lifted) and, on request, on a copy with only the recorded sex flipped. The rows
name the stay and hold the model's answer only: labels are read from the listfiles here.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scehr.training.data.layout import DEMOGRAPHICS_FILE, TIMESERIES_SUFFIX, task_dir
from scehr.training.data.reader import labels, resolve_split

#: The splits `scehr evaluate --split all` reads, in order.
ALL_SPLITS = ("train", "val", "test")


@dataclass
class ServedScores:
    """Per stay (class 0 of a binary model): the service's answer, as `scehr score` wrote it.

    `risk`/`score` are NaN where the service gave none; `in_set` is [N, 2] (no outcome,
    outcome) membership of the served outcome set, all False where the model has no
    uncertainty map (`has_interval` False)."""

    stays: np.ndarray  # [N] str, the listfile's `stay`
    split: np.ndarray  # [N] str
    y: np.ndarray  # [N] float 0/1
    status: np.ndarray  # [N] str: ok | insufficient_data | error
    reasons: list[list[str]]  # per stay: why it abstained, or its errors
    risk: np.ndarray
    score: np.ndarray
    alert: np.ndarray  # [N] bool, at the model's default operating point
    in_set: np.ndarray  # [N, 2] bool
    has_interval: bool

    @property
    def abstained(self) -> np.ndarray:
        return self.status == "insufficient_data"

    @property
    def errors(self) -> np.ndarray:
        return self.status == "error"

    def take(self, index: np.ndarray) -> ServedScores:
        index = np.flatnonzero(index) if np.asarray(index).dtype == bool else np.asarray(index)
        return ServedScores(self.stays[index], self.split[index], self.y[index],
                            self.status[index], [self.reasons[i] for i in index],
                            self.risk[index], self.score[index], self.alert[index],
                            self.in_set[index], self.has_interval)


def score_folder(model: Path, folder: Path, out: Path, *, allow_insufficient: bool) -> None:
    """`scehr score MODEL FOLDER --out OUT` in a child process (this interpreter's `scehr`);
    its summary line goes to stderr, a failure is raised with its message. A legacy model
    (served only on request) is scored too: evaluating it is asking for it, and the report
    says what it lacks (no interval, no data minimum)."""
    cmd = [sys.executable, "-m", "scehr.cli", "score", str(model), str(folder), "--out",
           str(out), "--device", "cpu", "--quiet"]
    if allow_insufficient:
        cmd.append("--allow-insufficient")
    env = {**os.environ, "SCEHR_ALLOW_LEGACY_MODELS": "true"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in res.stderr.splitlines():
        if line.startswith("scehr score: ") and " stays read: " in line:
            print(line.split(" -> ")[0], file=sys.stderr, flush=True)
    if res.returncode != 0:
        raise RuntimeError(f"scehr score {model} {folder} failed ({res.returncode}): "
                           f"{res.stderr.strip()[-2000:]}")


def read_rows(path: Path) -> dict[str, dict[str, Any]]:
    """`scehr score`'s JSON Lines output by stay id."""
    return {r["id"]: r for r in map(json.loads, path.read_text().splitlines()) if r}


def _split_tables(data: Path, task: str, splits: tuple[str, ...]
                  ) -> list[tuple[str, Path, list[str], np.ndarray]]:
    """(split, its folder, its stays, their class-0 labels) per split."""
    tdir = task_dir(data, task)
    out = []
    for split in splits:
        spec = resolve_split(tdir, task, split)
        out.append((split, spec.files_dir, spec.table["stay"].astype(str).tolist(),
                    labels(spec.table, task)[:, 0].astype(np.float64)))
    return out


def _class0(row: dict[str, Any] | None, label: str) -> dict[str, Any] | None:
    if row is None or row["status"] != "ok":
        return None
    return row["results"].get(label)


def sex_flipped_folder(folder: Path, out: Path) -> Path:
    """`folder` (a benchmark split folder) with only the recorded sex flipped: its
    demographics.csv with sex_male 1 <-> 0 (unknown stays unknown), its time series linked."""
    out.mkdir(parents=True)
    shutil.copyfile(folder / "listfile.csv", out / "listfile.csv")
    for f in folder.glob(f"*{TIMESERIES_SUFFIX}"):
        (out / f.name).symlink_to(f.resolve())
    demo = folder / DEMOGRAPHICS_FILE
    if demo.is_file():
        with open(demo, newline="") as fh:
            reader = csv.DictReader(fh)
            fields, rows = list(reader.fieldnames or []), list(reader)
        for r in rows:
            sex = (r.get("sex_male") or "").strip()
            if sex in ("0", "1", "0.0", "1.0"):
                r["sex_male"] = str(1.0 - float(sex))
        with open(out / DEMOGRAPHICS_FILE, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)
    return out


def served_scores(model: Path, data: Path, task: str, label: str,
                  splits: tuple[str, ...] = ALL_SPLITS, *, sex_flip: bool = False
                  ) -> dict[str, ServedScores]:
    """The stays of `splits` of `data`: "served" (as served), "lifted" (the data minimum
    lifted) and, with `sex_flip`, "sex_flipped" (lifted, only the recorded sex flipped)."""
    tables = _split_tables(data, task, splits)
    kinds = ("served", "lifted", "sex_flipped") if sex_flip else ("served", "lifted")
    rows: dict[str, dict[str, dict[str, Any]]] = {k: {} for k in kinds}
    with tempfile.TemporaryDirectory(prefix="scehr-evaluate-") as tmp:
        for n, folder in enumerate(dict.fromkeys(f for _, f, _, _ in tables)):
            for kind in kinds:
                source = (sex_flipped_folder(folder, Path(tmp) / f"flipped-{n}")
                          if kind == "sex_flipped" else folder)
                out = Path(tmp) / f"{kind}-{n}.jsonl"
                score_folder(model, source, out, allow_insufficient=kind != "served")
                rows[kind].update(read_rows(out))
    return {k: _assemble(tables, rows[k], label) for k in kinds}


def _assemble(tables: list[tuple[str, Path, list[str], np.ndarray]],
              rows: dict[str, dict[str, Any]], label: str) -> ServedScores:
    stays = [s for _, _, ss, _ in tables for s in ss]
    missing = [s for s in stays if s not in rows]
    if missing:
        raise ValueError(f"scehr score wrote no row for {len(missing)} stays of the listfiles "
                         f"(e.g. {missing[0]!r})")
    got = [rows[s] for s in stays]
    res = [_class0(r, label) for r in got]
    has_interval = any(c is not None and c.get("outcomes") is not None for c in res)

    def field(name: str) -> np.ndarray:
        return np.array([np.nan if c is None or c.get(name) is None else c[name] for c in res],
                        dtype=np.float64)

    sets = [(c or {}).get("outcomes") or "" for c in res]
    return ServedScores(
        stays=np.array(stays, dtype=str),
        split=np.array([sp for sp, _, ss, _ in tables for _ in ss], dtype=str),
        y=np.concatenate([y for *_, y in tables]),
        status=np.array([r["status"] for r in got], dtype=str),
        reasons=[[e.get("message", e.get("rule", "")) for e in r["errors"]] for r in got],
        risk=field("risk"), score=field("score"),
        alert=np.array([bool(c and c.get("alert")) for c in res]),
        in_set=np.array([["no_outcome" in s.split(";"), "outcome" in s.split(";")]
                         for s in sets], dtype=bool).reshape(len(sets), 2),
        has_interval=has_interval)

