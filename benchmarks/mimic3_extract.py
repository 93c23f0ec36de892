"""MIMIC-III extraction: mimic3-benchmarks' scripts vs `scehr data extract-mimic3`, side by side.

Builds a scaled-up copy of the MIMIC-III demo in a temporary folder (the demo repeated COPIES
times, every subject, admission and ICU stay id shifted by k * 1,000,000 in copy k; upper-case
headers, plain CSV as the official files), runs the reference pipeline (its scripts for the
root folder and the four tasks, `REFERENCE_STEPS`, in a Python environment with its pinned
pandas) and ours on it, each under /usr/bin/time -v, and
prints wall time, CPU time, peak resident memory, the load average, and whether the outputs
agree (`scehr.training.data.mimic3.compare`).

    python benchmarks/mimic3_extract.py --copies 14 \
        --reference-dir /tmp/mimic3-benchmarks --reference-python /tmp/m3b-venv/bin/python

The reference checkout is github.com/YerevaNN/mimic3-benchmarks (any commit with these
scripts; ea0314c was measured); its environment needs pandas 1.x, numpy, pyyaml, tqdm (the
pins of its requirements.txt install on Python 3.7). Without --reference-dir only ours runs;
`--reference-wall S` then prints the speed-up against a reference wall time measured before (the
reference's time does not depend on our code), and `--mimic-dir` reuses a scaled copy built by
an earlier run (`--workdir`) instead of building one.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scehr.training.data.layout import data_dir  # noqa: E402

TABLES = ("PATIENTS", "ADMISSIONS", "ICUSTAYS", "DIAGNOSES_ICD", "D_ICD_DIAGNOSES", "CHARTEVENTS",
          "LABEVENTS", "OUTPUTEVENTS")
IDS = ("SUBJECT_ID", "HADM_ID", "ICUSTAY_ID")
SHIFT = 1_000_000
OURS = "scehr (Polars+DuckDB)"
REFERENCE_STEPS = (
    "mimic3benchmark.scripts.extract_subjects {mimic} {out}/root/",
    "mimic3benchmark.scripts.validate_events {out}/root/",
    "mimic3benchmark.scripts.extract_episodes_from_subjects {out}/root/",
    "mimic3benchmark.scripts.split_train_and_test {out}/root/",
    "mimic3benchmark.scripts.create_in_hospital_mortality {out}/root/ "
    "{out}/in-hospital-mortality/",
    "mimic3benchmark.scripts.create_decompensation {out}/root/ {out}/decompensation/",
    "mimic3benchmark.scripts.create_length_of_stay {out}/root/ {out}/length-of-stay/",
    "mimic3benchmark.scripts.create_phenotyping {out}/root/ {out}/phenotyping/",
    "mimic3models.split_train_val {out}/in-hospital-mortality",
    "mimic3models.split_train_val {out}/decompensation",
    "mimic3models.split_train_val {out}/length-of-stay",
    "mimic3models.split_train_val {out}/phenotyping",
)


def build_scaled(demo: Path, dest: Path, copies: int) -> int:
    """Write the scaled copy; returns its CHARTEVENTS row count."""
    dest.mkdir(parents=True, exist_ok=True)
    chart_rows = 0
    for table in TABLES:
        with gzip.open(demo / f"{table}.csv.gz", "rt", newline="") as f:
            reader = csv.reader(f)
            head = [c.upper() for c in next(reader)]
            rows = list(reader)
        shifted = [i for i, c in enumerate(head) if c in IDS]
        with open(dest / f"{table}.csv", "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(head)
            n = 1 if table.startswith("D_") else copies
            for k in range(n):
                off = k * SHIFT
                for r in rows:
                    if off:
                        r = list(r)
                        for i in shifted:
                            if r[i]:
                                r[i] = str(int(r[i]) + off)
                    w.writerow(r)
            if table == "CHARTEVENTS":
                chart_rows = len(rows) * n
    return chart_rows


def timed(cmd: str, log: Path) -> dict[str, float]:
    """Run `cmd` in bash under /usr/bin/time -v; wall, CPU seconds and peak RSS (MiB)."""
    with open(log, "w") as f:
        rc = subprocess.call(["/usr/bin/time", "-v", "bash", "-c", cmd], stdout=f,
                             stderr=subprocess.STDOUT)
    text = log.read_text(errors="replace")
    if rc != 0:
        raise SystemExit(f"command failed (rc {rc}), see {log}:\n{text[-2000:]}")

    def field(name: str) -> str:
        return re.findall(rf"{re.escape(name)}: (.+)", text)[-1].strip()

    parts = [float(x) for x in field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")]
    wall = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
    return {"wall_s": wall,
            "cpu_s": float(field("User time (seconds)")) + float(field("System time (seconds)")),
            "peak_mib": float(field("Maximum resident set size (kbytes)")) / 1024}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=14, help="demo copies (14: 10.6 M chart rows)")
    ap.add_argument("--demo", type=Path, default=data_dir() / "mimic3-demo")
    ap.add_argument("--reference-dir", type=Path, default=None,
                    help="a mimic3-benchmarks checkout (omit to time ours only)")
    ap.add_argument("--reference-python", default=sys.executable,
                    help="Python with the reference's dependencies")
    ap.add_argument("--reference-wall", type=float, default=None,
                    help="without --reference-dir: the reference's wall seconds from an earlier "
                         "side-by-side run, to print the speed-up against")
    ap.add_argument("--mimic-dir", type=Path, default=None,
                    help="an existing scaled copy (skip building one)")
    ap.add_argument("--memory-limit", default="2GB", help="ours: DuckDB memory limit")
    ap.add_argument("--workdir", type=Path, default=None, help="keep everything here")
    args = ap.parse_args()

    tmp = args.workdir or Path(tempfile.mkdtemp(prefix="mimic3-bench-"))
    tmp.mkdir(parents=True, exist_ok=True)
    if args.mimic_dir:
        mimic = args.mimic_dir
        with open(mimic / "CHARTEVENTS.csv", "rb") as f:
            chart = sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 24), b"")) - 1
    else:
        mimic = tmp / "mimic"
        print(f"building {args.copies} copies of the demo in {mimic} ...", flush=True)
        chart = build_scaled(args.demo, mimic, args.copies)
    print(f"CHARTEVENTS rows: {chart:,}", flush=True)
    load0 = os.getloadavg()
    results = {}
    scehr = f"{sys.executable} -m scehr.cli"
    ours = tmp / "ours"
    shutil.rmtree(ours, ignore_errors=True)
    results[OURS] = timed(
        f"{scehr} data extract-mimic3 {mimic} {ours} --memory-limit {args.memory_limit}",
        tmp / "ours.log")
    if args.reference_dir:
        ref = tmp / "reference"
        shutil.rmtree(ref, ignore_errors=True)
        steps = " && ".join(f"{args.reference_python} -m {s.format(mimic=mimic, out=ref)}"
                            for s in REFERENCE_STEPS)
        results["mimic3-benchmarks"] = timed(f"cd {args.reference_dir} && {steps}",
                                             tmp / "reference.log")
    load1 = os.getloadavg()
    print(f"\nCHARTEVENTS rows {chart:,}; load average before {load0[0]:.2f} {load0[1]:.2f} "
          f"{load0[2]:.2f}, after {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} "
          f"({os.cpu_count()} CPUs)")
    print(f"{'pipeline':<20} {'wall s':>9} {'CPU s':>9} {'peak MiB':>9}")
    for name, r in results.items():
        print(f"{name:<20} {r['wall_s']:>9.1f} {r['cpu_s']:>9.1f} {r['peak_mib']:>9.0f}")
    if len(results) == 1 and args.reference_wall:
        b = results[OURS]
        print(f"speed-up against the reference's earlier {args.reference_wall:.1f} s wall: "
              f"{args.reference_wall / b['wall_s']:.1f}x (not side by side: the lead's quiet "
              "re-run with --reference-dir is the figure to report)")
    if len(results) == 2:
        a, b = results["mimic3-benchmarks"], results[OURS]
        print(f"speed-up: wall {a['wall_s'] / b['wall_s']:.1f}x, "
              f"CPU {a['cpu_s'] / b['cpu_s']:.1f}x")
        from scehr.training.data.mimic3.compare import compare_trees

        report = compare_trees(ours, tmp / "reference")
        print(report.summary())
    print(f"files kept in {tmp}" if args.workdir else f"(temporary folder {tmp})")
    if not args.workdir:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
