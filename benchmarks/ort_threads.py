"""ORT wall and CPU time per row by run size: one intra-op thread against the served count.

    .venv/bin/python benchmarks/ort_threads.py [--task mortality] [--threads N] [--reps 3]

The served model's session gets cores // workers intra-op threads (`Settings.ort_threads`);
for runs of at most `scehr.service.registry.LIGHT_ROWS` rows the server uses a second session with
one thread (`LoadedModel.light`). This times both sessions on the same real stays, batched to
each run size (runs are padded to a multiple of RUN_ROW_BLOCK rows, as served), alternating
the two in every repetition; CPU is `time.process_time` (ORT's threads included). Best of
`--reps`. Also checks that both give bit-identical outputs. Only prints.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from common import loadavg, model_dir
from payloads import default_model_stays

from scehr.schemas.payloads import StayPayload
from scehr.service.batcher import batch
from scehr.service.pipeline import prepare
from scehr.service.registry import LIGHT_ROWS, load_model, read_index, resolve
from scehr.service.settings import Settings, available_cores

SIZES = (1, 4, 8, 16, 32)
ROWS = 64  # rows per timed block: every size runs the same stays


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="mortality")
    ap.add_argument("--threads", type=int, default=available_cores(),
                    help="the served session's threads (default: cores, one worker)")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    load_before = loadavg()
    models, which = model_dir()
    stays, _ = default_model_stays(args.task, ROWS, models)
    folder = resolve(models, read_index(models), args.task)
    sessions = {k: load_model(folder, args.task, Settings(model_dir=models, device="cpu",
                                                          intra_op_threads=k))
                for k in (1, args.threads)}
    spec = sessions[1].spec
    rows = [prepare(spec, [StayPayload.model_validate(s)]).inputs for s in stays]
    best: dict[tuple[int, int], tuple[float, float]] = {}
    identical = True
    for _ in range(args.reps):
        for size in SIZES:
            runs = [batch(rows[i : i + size]) for i in range(0, ROWS, size)]
            outs = {}
            for k, m in sessions.items():
                m.light = None  # this session for every size
                w0, c0 = time.perf_counter(), time.process_time()
                outs[k] = [m.run(x) for x in runs]
                wall = (time.perf_counter() - w0) / ROWS * 1e3
                cpu = (time.process_time() - c0) / ROWS * 1e3
                old = best.get((size, k), (np.inf, np.inf))
                best[(size, k)] = (min(old[0], wall), min(old[1], cpu))
            a, b = outs[1], outs[args.threads]
            identical &= all(np.array_equal(getattr(x, f), getattr(y, f))
                             for x, y in zip(a, b, strict=True)
                             for f in ("z", "anchor_logits", "probability"))
    print(f"{which}; task {args.task}; {ROWS} real stays; {os.cpu_count()} cores; "
          f"LIGHT_ROWS {LIGHT_ROWS}; load average before: {load_before}, after: {loadavg()}")
    print(f"| rows per run | 1 thread: wall ms/row | CPU ms/row | {args.threads} threads: wall "
          "ms/row | CPU ms/row |")
    print("|---|---|---|---|---|")
    for size in SIZES:
        (w1, c1), (wn, cn) = best[(size, 1)], best[(size, args.threads)]
        print(f"| {size} | {w1:.3f} | {c1:.3f} | {wn:.3f} | {cn:.3f} |")
    print("outputs bit-identical:", identical)


if __name__ == "__main__":
    main()
