"""An earlier checkout's `prepare` + `predictions` against this one's, stay by stay, in one process.

    git archive <commit> service schemas | tar -x -C /tmp/old-src
    .venv/bin/python benchmarks/prepare_ab.py --source /tmp/old-src [--stays 200] [--passes 3]

On a shared machine, runs of `profile_stages.py --source` minutes apart see different loads;
here the two versions alternate per stay (which goes first alternates too), so a busy
neighbour slows both alike and the paired difference stays meaningful. The earlier checkout's
`schemas/` and `service/` are copied to a temporary folder as `oldschemas`/`oldservice` (their
imports rewritten), so both load side by side. Each stay's response JSON must be the same
bytes from both (else exit 1). CPU time of the calling thread (`time.thread_time`), ORT at
one thread; medians over stays and passes, and the median per-stay saving. Only prints.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from common import dumps, model_dir
from payloads import default_model_stays

_IMPORT = re.compile(r"\b(from|import) (schemas|service)([. ])")


def renamed_copy(source: Path, into: Path) -> None:
    """`source`'s schemas/ and service/ as oldschemas/ and oldservice/ under `into`."""
    for name in ("schemas", "service"):
        shutil.copytree(source / name, into / f"old{name}")
    for f in into.rglob("*.py"):
        f.write_text(_IMPORT.sub(r"\1 old\2\3", f.read_text()))


def load(prefix: str, models: Path) -> tuple[Any, Any, Any]:
    """(StayPayload, the module with `prepare` and `predictions`, loaded mortality model) of
    one version."""
    payloads = importlib.import_module(f"{prefix}schemas.payloads")
    pipeline = importlib.import_module(f"{prefix}service.pipeline")
    try:  # the answers in their own module; before, in the pipeline
        responses = importlib.import_module(f"{prefix}service.responses")
        pipeline = SimpleNamespace(prepare=pipeline.prepare, predictions=responses.predictions)
    except ModuleNotFoundError:
        pass
    registry = importlib.import_module(f"{prefix}service.registry")
    settings = importlib.import_module(f"{prefix}service.settings")
    m = registry.load_model(
        registry.resolve(models, registry.read_index(models), "mortality"), "mortality",
        settings.Settings(model_dir=models, device="cpu", intra_op_threads=1))
    return payloads.StayPayload, pipeline, m


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True, type=Path,
                    help="an earlier checkout (its service/ and schemas/ are read)")
    ap.add_argument("--stays", type=int, default=200)
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="scehr-ab-"))
    try:
        renamed_copy(args.source, tmp)
        sys.path.insert(0, str(tmp))
        models, _ = model_dir()
        versions = {"old": load("old", models), "new": load("", models)}
        stays, what = default_model_stays("mortality", args.stays, models)
        bodies = [dumps(s) for s in stays]
        gc.collect()
        gc.freeze()
        times: dict[str, list[float]] = {f"{v} {s}": [] for s in ("prepare", "predictions")
                                         for v in versions}
        for p in range(args.passes):
            for i, b in enumerate(bodies):
                order = ["old", "new"] if (i + p) % 2 else ["new", "old"]
                answers = []
                for v in order:
                    stay_model, pipeline, m = versions[v]
                    stay = stay_model.model_validate_json(b)
                    t0 = time.thread_time()
                    prep = pipeline.prepare(m.spec, [stay])
                    t1 = time.thread_time()
                    out = m.run(prep.inputs)
                    t2 = time.thread_time()
                    pred = pipeline.predictions(m.spec, prep, out)[0]
                    t3 = time.thread_time()
                    times[f"{v} prepare"].append(t1 - t0)
                    times[f"{v} predictions"].append(t3 - t2)
                    answers.append(pred.model_dump_json())
                if answers[0] != answers[1]:
                    sys.exit(f"stay {i}: the two versions answer differently")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{what}; {args.passes} passes, old ({args.source}) and new (this checkout) "
          f"alternated per stay; same response bytes; load average {os.getloadavg()}")
    print("| stage | old CPU ms | new CPU ms | saved per stay (median of pairs) |")
    print("|---|---|---|---|")
    for stage in ("prepare", "predictions"):
        old, new = np.array(times[f"old {stage}"]), np.array(times[f"new {stage}"])
        print(f"| {stage} | {np.median(old) * 1e3:.3f} | {np.median(new) * 1e3:.3f} | "
              f"{np.median(old - new) * 1e3:.3f} |")


if __name__ == "__main__":
    main()
