"""Where `extract-mimic3`'s time goes: wall, user and system seconds of each step, in process.

    python benchmarks/mimic3_extract_steps.py MIMIC_DIR OUT

Runs `scehr.training.data.mimic3.pipeline.extract` with a progress callback that prints, at each
progress message, the time since the previous one (wall; user and system CPU of the whole
process, DuckDB's threads and the file-writer threads included) and the load average at the
end. OUT is deleted first, so the event tables are scanned again. Two steps run beside others
(the scan beside the cohort, the timeseries and episodes beside events.csv), and their lines
interleave: a line's seconds are everything the process did until the next line.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import loadavg  # noqa: E402

from scehr.training.data.mimic3.pipeline import extract  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mimic_dir", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--memory-limit", default="2GB")
    args = ap.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    load0 = loadavg()
    last = [time.perf_counter(), 0.0, 0.0]
    label = ["start"]

    def step(msg: str) -> None:
        r = resource.getrusage(resource.RUSAGE_SELF)
        now = time.perf_counter()
        print(f"{now - last[0]:7.1f} wall {r.ru_utime - last[1]:7.1f} user "
              f"{r.ru_stime - last[2]:7.1f} sys  {label[0]}", flush=True)
        last[:] = [now, r.ru_utime, r.ru_stime]
        label[0] = msg

    print(f"{'wall s':>7} {'':4} {'user s':>7} {'':4} {'sys s':>7} {'':3} step (until the next)")
    extract(args.mimic_dir, args.out, memory_limit=args.memory_limit, progress=step)
    step("end")
    print(f"load average before {load0}, after {loadavg()} ({os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
