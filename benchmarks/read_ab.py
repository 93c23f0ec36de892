"""Reading + discretizing before/after a change, alternated in one process.

    nice .venv/bin/python -m benchmarks.read_ab --before main [--passes 7] [--data DIR]

Loads `training/data/reader.py` and `schemas/tensorize.py` as they were at git revision
`--before` (`git show`, as standalone modules; the old reader bound to the old `clean`) next to
the current ones, and runs `read_timeseries` + `discretize` (one 48-hour window) of each on the
in-hospital-mortality test split of `--data` (by default the 4,000 PhysioNet set-C stays of
`data/physionet2012-benchmark`), alternating the revisions pass by pass. Prints, per stage, the
best thread CPU time over the passes of each revision (less sensitive to other jobs than wall
time), the before/after ratio and the load average before and after; the discretized tensors
of the two must be identical or it exits non-zero. Only prints. The ratio against the
mimic3-benchmarks reference is `benchmarks.reference_read_tensorize`'s.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pandas as pd

from scehr.schemas import tensorize
from scehr.schemas.featureset import BENCHMARK_48H
from scehr.training.data import reader
from scehr.training.data.layout import repo_root

WINDOW = 48.0


def module_at(rev: str, path: str, name: str, folder: Path) -> ModuleType:
    """The file `path` as it was at `rev`, imported as module `name`."""
    source = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=repo_root(), check=True,
                            capture_output=True).stdout
    file = folder / f"{name}.py"
    file.write_bytes(source)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="main", help="git revision to compare with")
    ap.add_argument("--passes", type=int, default=7)
    ap.add_argument("--data", type=Path, default=repo_root() / "data" / "physionet2012-benchmark")
    args = ap.parse_args()
    test_dir = args.data / "in-hospital-mortality" / "test"
    stays = pd.read_csv(test_dir / "listfile.csv", dtype={"stay": str})["stay"]
    paths = [test_dir / s for s in stays]
    end = np.full(len(paths), WINDOW)
    with tempfile.TemporaryDirectory() as tmp:
        old_tensorize = module_at(args.before, "schemas/tensorize.py", "before_tensorize",
                                  Path(tmp))
        old_reader = module_at(args.before, "training/data/reader.py", "before_reader",
                               Path(tmp))
    old_reader.clean = old_tensorize.clean
    old_reader.in_stay_time_order = old_tensorize.in_stay_time_order
    code = {"before": (old_reader, old_tensorize), "now": (reader, tensorize)}
    cpu: dict[tuple[str, str], list[float]] = {}
    load = os.getloadavg()
    for k in range(args.passes + 1):  # pass 0 warms the page cache and imports: not counted
        x = {}
        for rev in (("before", "now") if k % 2 else ("now", "before")):
            read, tens = code[rev]
            t0 = time.thread_time()
            obs, _ = read.read_timeseries(paths, BENCHMARK_48H, progress=False)
            t1 = time.thread_time()
            x[rev], _ = tens.discretize(obs, BENCHMARK_48H, end)
            t2 = time.thread_time()
            if k:
                cpu.setdefault((rev, "read"), []).append(t1 - t0)
                cpu.setdefault((rev, "discretize"), []).append(t2 - t1)
                cpu.setdefault((rev, "end to end"), []).append(t2 - t0)
        if not np.array_equal(x["before"], x["now"]):
            raise SystemExit("the two revisions' tensors differ")
    print(f"{test_dir}: {len(paths)} stays; {args.passes} passes each, best thread CPU; load "
          f"average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f} (nproc "
          f"{os.cpu_count()})")
    print(f"{'stage':12} {args.before:>12} {'now':>10} {'before/now':>11}")
    for stage in ("read", "discretize", "end to end"):
        a, b = min(cpu[("before", stage)]), min(cpu[("now", stage)])
        print(f"{stage:12} {a * 1e3:9.1f} ms {b * 1e3:7.1f} ms {a / b:10.2f}x")
    print("tensors identical: True")


if __name__ == "__main__":
    main()
