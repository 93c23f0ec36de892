"""What padding a lone stay's ORT run to RUN_ROW_BLOCK rows costs on the CPU.

    .venv/bin/python benchmarks/padding_cost.py [--task mortality] [--stays 50] [--reps 20]

Runs on the CPU are padded to a multiple of `scehr.service.registry.RUN_ROW_BLOCK` rows (copies of
the last row, cut back) so that a stay's outputs never depend on which stays share its run
(docs/deployment.md, "Batch scoring"). For real test stays scored one at a time (a lone
request at `explain=basic`), this prints the CPU ms per stay of the served run (padded) and of
a bare `session.run` of the one row, with 1 and 2 intra-op threads (best of `--reps` passes,
`time.process_time`: ORT's threads included), and the load average. Only prints.
"""

from __future__ import annotations

import argparse
import time

from common import loadavg, model_dir
from payloads import default_model_stays

from scehr.schemas.contract import GRAPH
from scehr.schemas.payloads import StayPayload
from scehr.service.batcher import ModelInputs
from scehr.service.pipeline import prepare
from scehr.service.registry import LoadedModel, load_model, read_index, resolve
from scehr.service.settings import Settings


def unpadded(m: LoadedModel, inputs: ModelInputs) -> object:
    return m.session.run(list(GRAPH.output_names), m.feeds(inputs))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="mortality")
    ap.add_argument("--stays", type=int, default=50)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    load_before = loadavg()
    models, which = model_dir()
    stays, what = default_model_stays(args.task, args.stays, models)
    print(f"{which}; task {args.task}; {what}; load average before: {load_before}")
    print("| intra-op threads | unpadded 1 row, CPU ms | served (padded to the row block), "
          "CPU ms | padding costs |")
    print("|---|---|---|---|")
    for threads in (1, 2):
        m = load_model(resolve(models, read_index(models), args.task), args.task,
                       Settings(model_dir=models, device="cpu", intra_op_threads=threads))
        rows = [prepare(m.spec, [StayPayload.model_validate(s)]).inputs for s in stays]
        rows = [r for r in rows if r is not None]
        best = {"bare": float("inf"), "served": float("inf")}
        for _ in range(args.reps):  # alternating, so that load bursts hit both alike
            for k, run in (("bare", lambda r, m=m: unpadded(m, r)), ("served", m.run)):
                t0 = time.process_time()
                for r in rows:
                    run(r)
                best[k] = min(best[k], (time.process_time() - t0) / len(rows) * 1e3)
        print(f"| {threads} | {best['bare']:.3f} | {best['served']:.3f} | "
              f"+{best['served'] - best['bare']:.3f} ms |")
    print(f"load average after: {loadavg()}")


if __name__ == "__main__":
    main()
