"""Peak memory of one training epoch, streamed against in memory, as the data grows.

The MIMIC-III demo is extracted once (`scehr data extract-mimic3`'s pipeline) into a temporary
folder, then copied k times for each scale k: every stay again under a new subject id
(`9<copy><subject>`), in the same split, its timeseries file hard-linked. Each (scale, mode) is
one `scehr train --epochs 1` in a child process (split preparation, one epoch, prediction of
every split, a small bootstrap; no plots), whose memory is read from /proc (Linux):

- main peak RSS: the kernel's high-water mark of the training process (VmHWM), exact;
- tree peak PSS: the largest sum over the process and its loader workers of their proportional
  set size (shared pages split between the processes that share them), sampled every 20 ms;
  this is what the run takes from the machine.

Memory is no timing: the figures hold on a busy machine. Nothing is written into the repo.

    .venv/bin/python benchmarks/streaming_memory.py [--task mortality] [--scales 1 5 10]
        [--workers 2] [--cache-stays 256] [--modes memory stream]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scehr.training.data.layout import TASK_DIRS, data_dir  # noqa: E402

LISTFILES = ("train_listfile.csv", "val_listfile.csv", "test_listfile.csv",
             "train/listfile.csv", "test/listfile.csv")


def renamed(stay: str, copy: int) -> str:
    """The stay's file name in copy `copy` (0: the original) under a new subject id."""
    return stay if copy == 0 else f"9{copy:03d}{stay}"


def write_scaled(extracted: Path, task: str, scale: int, dest: Path) -> int:
    """`dest/<task dir>` holding `scale` copies of every stay of the extraction; the stays."""
    src, out = extracted / TASK_DIRS[task], dest / TASK_DIRS[task]
    for part in ("train", "test"):
        (out / part).mkdir(parents=True)
    n = 0
    for name in LISTFILES:
        table = pd.read_csv(src / name, dtype={"stay": str})
        copies = [table.assign(stay=table.stay.map(lambda s, k=k: renamed(s, k)))
                  for k in range(scale)]
        pd.concat(copies).to_csv(out / name, index=False)
        if "/" in name:  # the per-folder listfiles name every stay once: link their files
            folder = name.split("/")[0]
            for stay in table.stay:
                for k in range(scale):
                    os.link(src / folder / stay, out / folder / renamed(stay, k))
            n += len(table) * scale
    return n


def _proc_kb(pid: int, field: str, file: str = "status") -> int:
    try:
        with open(f"/proc/{pid}/{file}") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants (children files of every thread)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return out


def measure(cmd: list[str], log: Path) -> tuple[float, float, float]:
    """(main peak RSS, tree peak PSS, seconds) of `cmd` in MiB; raises if it fails."""
    peak = {"pss": 0, "hwm": 0}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                pss = sum(_proc_kb(p, "Pss", "smaps_rollup") for p in _tree(proc.pid))
                peak["pss"] = max(peak["pss"], pss)
                peak["hwm"] = max(peak["hwm"], _proc_kb(proc.pid, "VmHWM"))
                time.sleep(0.02)

        t0 = time.perf_counter()
        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        rc = proc.wait()
        done.set()
        thread.join()
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({rc}); see {log}")
    return peak["hwm"] / 1024, peak["pss"] / 1024, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", default="mortality", choices=list(TASK_DIRS))
    ap.add_argument("--scales", type=int, nargs="+", default=[1, 5, 10])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cache-stays", type=int, default=256)
    ap.add_argument("--modes", nargs="+", choices=["memory", "stream"],
                    default=["memory", "stream"], help="which runs to measure")
    ap.add_argument("--demo", type=Path, default=data_dir() / "mimic3-demo",
                    help="the raw MIMIC-III demo (default: the shared data folder's)")
    args = ap.parse_args()

    from scehr.training.data.mimic3.pipeline import extract

    tmp = Path(tempfile.mkdtemp(prefix="scehr-stream-mem-"))
    try:
        extract(args.demo, tmp / "extracted", progress=lambda _s: None)
        train = [sys.executable, "-m", "scehr.cli", "train", "--task", args.task,
                 "--epochs", "1", "--n-boot", "10", "--no-plots", "--no-progress",
                 "--threads", "1"]
        modes = {"in memory": [],
                 f"streamed, {args.workers} workers, cache {args.cache_stays}":
                     ["--stream", "--workers", str(args.workers),
                      "--cache-stays", str(args.cache_stays)]}
        modes = {m: a for (m, a), key in zip(modes.items(), ("memory", "stream"), strict=True)
                 if key in args.modes}
        print(f"{args.task}: one training epoch over the MIMIC-III demo scaled k times "
              "(MiB; main: peak RSS of the training process; tree: peak PSS of it and its "
              "loader workers)")
        print(f"| scale | stays | {' | '.join(f'{m}: main / tree' for m in modes)} |")
        print("|---:|---:|" + "---:|" * len(modes))
        for scale in args.scales:
            data = tmp / f"x{scale}"
            n = write_scaled(tmp / "extracted", args.task, scale, data)
            cells = []
            for k, extra in enumerate(modes.values()):
                env_cache = data / f".cache-{k}"  # in-memory runs build their array cache
                cmd = [*train, "--data", str(data), "--out", str(tmp / f"run-{scale}-{k}"),
                       *extra]
                os.environ["SCEHR_CACHE_DIR"] = str(env_cache)
                main_mb, tree_mb, _ = measure(cmd, tmp / f"log-{scale}-{k}.txt")
                cells.append(f"{main_mb:.0f} / {tree_mb:.0f}")
            print(f"| {scale}x | {n} | {' | '.join(cells)} |", flush=True)
            shutil.rmtree(data)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
