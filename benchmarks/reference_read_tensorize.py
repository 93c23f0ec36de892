"""Read + tensorize, end to end, against the real mimic3-benchmarks reader and Discretizer.

    nice .venv/bin/python -m benchmarks.reference_read_tensorize [--data DIR] [--repeat 3]

Input: the in-hospital-mortality test split of a converted folder (by default
`data/physionet2012-benchmark`, i.e. the 4,000 PhysioNet set-C stays). The reference is
`InHospitalMortalityReader` + `read_chunk` + `Discretizer(timestep=1.0, store_masks=True,
impute_strategy='previous', start_time='zero').transform(X, end=48)` of mimic3-benchmarks
(`load_data` of its in-hospital-mortality models, copied verbatim in
`tests/oracles/mimic3_benchmarks.py`, config from the shared data folder). scehr's path is
`scehr.training.data.reader.read_timeseries` (plausibility and benchmark cleaning included) +
`scehr.schemas.tensorize.discretize`. Both run in this one process on the same files (page cache
warm for both); outputs must be identical or the script exits non-zero. Both stages are timed
separately and end to end, in wall-clock and CPU seconds (both paths run on one thread, so on
a shared machine CPU time is the steadier figure); scehr's are the best of `--repeat` passes,
the reference's of one (it takes ~15 s or more). Pinned to one BLAS thread; neither uses BLAS.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np
import pandas as pd

from scehr.schemas.featureset import BENCHMARK_48H
from scehr.schemas.tensorize import discretize
from scehr.training.data.layout import data_dir, repo_root
from scehr.training.data.reader import read_timeseries
from tests.oracles import mimic3_benchmarks as ref

WINDOW = 48.0


class Clock:
    """Wall and CPU seconds of a stage: on a shared machine CPU time (both paths run on one
    thread) is the steadier figure, wall time the one a user sees."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def time(self, run: Callable[[], Any]) -> Any:
        w, c = time.perf_counter(), time.process_time()
        out = run()
        self.wall, self.cpu = time.perf_counter() - w, time.process_time() - c
        return out


def readable_listfile(test_dir: Path, out: Path) -> int:
    """Write the listfile without header-only stays (the reference reader's `np.stack` fails on
    them; PhysioNet set C has 2): both paths read exactly these stays. Returns how many left."""
    table = pd.read_csv(test_dir / "listfile.csv", dtype={"stay": str})
    has_rows = [len((test_dir / s).read_bytes().strip().splitlines()) > 1 for s in table["stay"]]
    table[has_rows].to_csv(out, index=False)
    return len(table) - int(np.sum(has_rows))


def reference(test_dir: Path, listfile: Path) -> tuple[np.ndarray, Clock, Clock]:
    """mimic3-benchmarks `load_data` split into its two stages: (x, read, discretize)."""
    config = (data_dir() / "mimic3-benchmarks-resources" / "mimic3models" / "resources"
              / "discretizer_config.json")
    disc = ref.Discretizer(timestep=1.0, store_masks=True, impute_strategy="previous",
                           start_time="zero", config_path=str(config))
    read, tens = Clock(), Clock()

    def load() -> dict[str, list[Any]]:
        reader = ref.InHospitalMortalityReader(str(test_dir), str(listfile),
                                               period_length=WINDOW)
        return ref.read_chunk(reader, reader.get_number_of_examples())

    chunk = read.time(load)
    x = tens.time(lambda: np.array([disc.transform(X, end=t)[0] for X, t in
                                    zip(chunk["X"], chunk["t"], strict=True)]))
    return x, read, tens


def scehr(test_dir: Path, listfile: Path) -> tuple[np.ndarray, Clock, Clock]:
    """scehr's reader + discretize on the same listfile: (x, read, discretize)."""
    read, tens = Clock(), Clock()

    def load() -> Any:
        stays = pd.read_csv(listfile, dtype={"stay": str})["stay"]
        return read_timeseries([test_dir / s for s in stays], BENCHMARK_48H, progress=False)[0]

    obs = read.time(load)
    x, _ = tens.time(lambda: discretize(obs, BENCHMARK_48H, np.full(obs.n_stays, WINDOW)))
    return x, read, tens


def cpu_model() -> str:
    """The CPU's model name (Linux), for the figures' context."""
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=repo_root() / "data" / "physionet2012-benchmark")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    test_dir = args.data / "in-hospital-mortality" / "test"
    with tempfile.TemporaryDirectory() as tmp:
        listfile = Path(tmp) / "listfile.csv"
        skipped = readable_listfile(test_dir, listfile)
        load = os.getloadavg()
        x_new, _, _ = scehr(test_dir, listfile)  # warm-up: page cache, imports, lru caches
        x_ref, ref_read, ref_disc = reference(test_dir, listfile)
        runs = [scehr(test_dir, listfile)[1:] for _ in range(args.repeat)]
    identical = x_ref.shape == x_new.shape and np.array_equal(x_ref.astype(np.float32), x_new)
    print(f"{test_dir}: {len(x_new)} stays ({skipped} header-only left out), "
          f"x {tuple(x_new.shape)}; load average before {load[0]:.2f}, after "
          f"{os.getloadavg()[0]:.2f} (nproc {os.cpu_count()}, {cpu_model()}); scehr: best of "
          f"{args.repeat}")
    print(f"{'stage':24} {'clock':5} {'mimic3-benchmarks':>18} {'scehr':>10} {'speed-up':>9}")
    for clock in ("wall", "cpu"):
        ref_r, ref_d = getattr(ref_read, clock), getattr(ref_disc, clock)
        ours = [(getattr(r, clock), getattr(d, clock)) for r, d in runs]
        for name, a, b in (("read (CSV -> rows/obs)", ref_r, min(r for r, _ in ours)),
                           ("discretize", ref_d, min(d for _, d in ours)),
                           ("end to end", ref_r + ref_d, min(r + d for r, d in ours))):
            print(f"{name:24} {clock:5} {a * 1e3:15,.0f} ms {b * 1e3:7,.0f} ms {a / b:8.1f}x")
    print(f"outputs identical (float32 of the reference's float64): {identical}")
    if not identical:
        raise SystemExit("outputs differ")


if __name__ == "__main__":
    main()
