"""Tensorize throughput on real stays: the vectorized path against a per-row implementation.

Input: PhysioNet 2012 set a, parsed once into long-form arrays (not timed). Both
implementations tensorize the same arrays over the 48-hour window; outputs must be identical.
Run: `python -m benchmarks.tensorize_throughput [--set a] [--repeat 5]` (pins itself to one
thread of numpy's BLAS; tensorize uses no BLAS anyway).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

from scehr.schemas.featureset import BENCHMARK_48H
from scehr.schemas.tensorize import discretize
from scehr.training.data.layout import data_dir
from scehr.training.data.physionet2012 import read_set
from tests.oracles.discretizer import discretize_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", default="a")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    src = data_dir() / "physionet2012"
    t0 = time.perf_counter()
    obs = read_set(src, args.set, progress=False).obs
    print(f"parsed set {args.set}: {obs.n_stays} stays, {len(obs):,} observations "
          f"({len(obs) / obs.n_stays:.0f} per stay) in {time.perf_counter() - t0:.1f} s "
          "(not timed below)")
    end = np.full(obs.n_stays, 48.0)

    best = np.inf
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        x, _ = discretize(obs, BENCHMARK_48H, end)
        best = min(best, time.perf_counter() - t0)
    t0 = time.perf_counter()
    ref = discretize_rows(obs, BENCHMARK_48H, end)
    t_ref = time.perf_counter() - t0

    identical = np.array_equal(x, ref)
    print(f"vectorized : {best * 1e3:8.1f} ms  {obs.n_stays / best:10,.0f} stays/s  "
          f"{len(obs) / best:12,.0f} obs/s  (best of {args.repeat})")
    print(f"per-row    : {t_ref * 1e3:8.1f} ms  {obs.n_stays / t_ref:10,.0f} stays/s  "
          f"{len(obs) / t_ref:12,.0f} obs/s")
    print(f"speed-up   : {t_ref / best:.1f}x   outputs identical: {identical}")
    if not identical:
        raise SystemExit("outputs differ")


if __name__ == "__main__":
    main()
