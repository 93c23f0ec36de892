"""Raw ONNX Runtime cost per stay of exported mortality models, side by side (batch 1).

Each model's own normalizer and static imputer prepare the same real test stays (set C of the
converted PhysioNet 2012 data); then each stay is scored alone with `session.run`, the models
taking turns stay by stay so a change in machine load hits both alike. Prints the median and
95th percentile wall time per stay, the CPU time per stay (`time.process_time`, less
sensitive to other jobs) and the load average before and after. One intra-op thread, as the
service's CPU sessions default to per worker.

Usage: .venv/bin/python -m benchmarks.ensemble_ort_cost DATA MODEL_DIR [MODEL_DIR ...]
           [--stays 400] [--warmup 20]
  e.g. data/physionet2012-full models/mortality/1.2.0 models/mortality/1.3.0
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from benchmarks.common import loadavg
from scehr.schemas.contract import INPUT_LENGTHS, INPUT_STATIC, INPUT_X
from scehr.schemas.featureset import FeatureSet
from scehr.schemas.manifest import load_manifest
from scehr.schemas.tensorize import Normalizer, StaticImputer
from scehr.training.data.splits import load_split


def feeds(model_dir: Path, data: str, n: int) -> tuple[ort.InferenceSession, list[dict]]:
    """The model's session and `n` single-stay feeds of the test split, prepared its way."""
    m = load_manifest(model_dir / "manifest.json")
    fs = FeatureSet.from_dict(m.feature_set)
    split = load_split(data, "mortality", "test", fs)
    x = Normalizer.from_dict(m.normalizer).transform(split.x[:n], split.lengths[:n])
    lengths = split.lengths[:n].astype(np.int64)
    static = (StaticImputer.from_dict(m.static).transform(split.static_raw[:n])
              if m.encoder.uses_static and m.static is not None else None)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(str(model_dir / m.onnx.file), opts,
                                   providers=["CPUExecutionProvider"])
    out = []
    for i in range(len(lengths)):
        f = {INPUT_X: x[i:i + 1].astype(np.float32), INPUT_LENGTHS: lengths[i:i + 1]}
        if static is not None:
            f[INPUT_STATIC] = static[i:i + 1].astype(np.float32)
        out.append(f)
    return session, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--stays", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=20)
    args = ap.parse_args()
    prepared = {str(d): feeds(d, args.data, args.stays) for d in args.models}
    for session, fs in prepared.values():
        for f in fs[:args.warmup]:
            session.run(None, f)
    wall: dict[str, list[float]] = {k: [] for k in prepared}
    cpu: dict[str, float] = dict.fromkeys(prepared, 0.0)
    before = loadavg()
    n = min(len(fs) for _, fs in prepared.values())
    for i in range(n):
        for name, (session, fs) in prepared.items():
            c0, t0 = time.process_time(), time.perf_counter()
            session.run(None, fs[i])
            wall[name].append((time.perf_counter() - t0) * 1000)
            cpu[name] += time.process_time() - c0
    print(f"{n} set-C stays, batch 1, one thread; load average before {before}, "
          f"after {loadavg()}")
    base = None
    for name, ts in wall.items():
        p50, p95 = np.percentile(ts, [50, 95])
        base = base or p50
        print(f"{name:32s} p50 {p50:7.3f} ms  p95 {p95:7.3f} ms  CPU {cpu[name] / n * 1000:7.3f} "
              f"ms/stay  ({p50 / base:.2f}x the first model's p50)")


if __name__ == "__main__":
    main()
