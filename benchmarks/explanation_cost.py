"""What occlusion contributions cost, and whether a cheap screen could stand in for them.

    .venv/bin/python benchmarks/explanation_cost.py [--stays 1200] [--data DIR]

On the default mortality model (models/index.json) and the validation stays of the converted
PhysioNet 2012 data (`data/physionet2012-full`, docs/data.md; never the test set):
1. ONNX Runtime's CPU time per row at batch sizes 1 to 256 (one intra-op thread, the
   service's session options): whether running the occlusion rows of many requests together
   (in the batcher) would make a row cheaper.
2. How many occlusion rows a stay needs (one per observed channel).
3. A screen that would run only `m` rows per stay: the `m` observed channels ranked by a
   cheap score, the exact occlusion delta computed for those only, the top 3 of them shown.
   Scores are fitted on the first half of the stays and evaluated on the second: the
   channel's mean |delta| (global importance), the same times how much occlusion changes the
   channel's columns, and a per-channel least-squares fit of |delta| on those features. It
   prints the share of the true top 3 (exact occlusion of every channel) the screen finds,
   and the share of stays whose top 3 it finds entirely.
Prints the figures and the load average; chooses nothing.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
from common import REPO, loadavg, real_models
from payloads import stay_payload

from scehr.schemas.payloads import StayPayload
from scehr.service.model import read_out
from scehr.service.pipeline import prepare
from scehr.service.registry import load_model, read_index, resolve
from scehr.service.runtime import session_options
from scehr.service.settings import Settings

TOP = 3


def row_cost(model_file: Path, feeds: dict[str, np.ndarray]) -> None:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model_file), session_options(1),
                                providers=["CPUExecutionProvider"])
    print("| rows per run | CPU ms per run | CPU ms per row |\n|---|---|---|")
    for b in (1, 4, 8, 32, 64, 128, 256):
        feed = {k: np.repeat(v[:1], b, axis=0) for k, v in feeds.items()}
        for _ in range(3):
            sess.run(None, feed)
        n = max(5, 400 // b)
        t = time.thread_time()
        for _ in range(n):
            sess.run(None, feed)
        ms = (time.thread_time() - t) / n * 1e3
        print(f"| {b} | {ms:.3f} | {ms / b:.4f} |")


def occlusions(m, stays: list[dict]) -> list[dict]:  # type: ignore[no-untyped-def]
    """Per stay: its observed channels, their exact |Δrisk| and |Δscore|, and two features."""
    cols = m.spec.fs.channel_columns
    out = []
    for body in stays:
        prep = prepare(m.spec, [StayPayload.model_validate(body)], occlusion=True)
        if not prep.ok:
            continue
        sc = read_out(m.spec, m.run(prep.inputs))
        chans = prep.occluded[0]
        k = len(chans)
        x = prep.inputs.x
        change = np.array([np.abs(x[0][:, cols[c]] - x[1 + j][:, cols[c]]).sum()
                           for j, c in enumerate(chans.tolist())])
        seen = np.array([x[0][:, cols[c][-1]].sum() for c in chans.tolist()])
        out.append({"chans": chans, "dr": np.abs(sc.risk[0, 0] - sc.risk[1:1 + k, 0]),
                    "dp": np.abs(sc.probability[0, 0] - sc.probability[1:1 + k, 0]),
                    "change": change, "seen": seen})
    return out


def true_top(s: dict) -> set[int]:
    order = np.lexsort((-s["dp"], -s["dr"]))[:TOP]  # as service.pipeline._contributions
    return {int(s["chans"][j]) for j in order}


def features(s: dict) -> np.ndarray:
    return np.stack([np.ones(len(s["chans"])), s["change"] / 48, np.log1p(s["seen"])], 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stays", type=int, default=1200)
    ap.add_argument("--data", type=Path, default=REPO / "data" / "physionet2012-full")
    args = ap.parse_args()
    before = loadavg()
    models = real_models()
    m = load_model(resolve(models, read_index(models), "mortality"), "mortality",
                   Settings(model_dir=models, device="cpu", intra_op_threads=1))
    task = args.data / "in-hospital-mortality"
    if not (task / "val_listfile.csv").is_file():
        raise SystemExit(f"no converted data at {task} (docs/data.md)")
    val = pd.read_csv(task / "val_listfile.csv", dtype={"stay": str}).head(args.stays)
    demo = pd.read_csv(task / "train" / "demographics.csv",
                       dtype={"stay": str}).set_index("stay").to_dict("index")
    stays = [stay_payload(task / "train", s, demo.get(s, {})) for s in val["stay"]]
    print(f"model {m.spec.ref.name} {m.spec.ref.version}; {len(stays)} validation stays; "
          f"load average before: {before}\n")
    prep = prepare(m.spec, [StayPayload.model_validate(stays[0])])
    assert prep.inputs is not None
    row_cost(m.path / m.spec.manifest.onnx.file, m.feeds(prep.inputs))
    occ = occlusions(m, stays)
    rows = np.array([len(s["chans"]) for s in occ])
    print(f"\noccluded channels (extra rows) per stay: median {np.median(rows):.0f}, "
          f"mean {rows.mean():.1f}, range {rows.min()}-{rows.max()} ({len(occ)} stays)\n")
    fit, test = occ[: len(occ) // 2], occ[len(occ) // 2 :]
    n_ch = m.spec.fs.n_channels
    xs: list[list[np.ndarray]] = [[] for _ in range(n_ch)]
    ys: list[list[float]] = [[] for _ in range(n_ch)]
    for s in fit:
        f = features(s)
        for j, c in enumerate(s["chans"].tolist()):
            xs[c].append(f[j])
            ys[c].append(float(s["dr"][j]))
    mean = np.array([np.mean(y) if y else 0.0 for y in ys])
    coef = [np.linalg.lstsq(np.array(x), np.array(y), rcond=None)[0] if len(y) >= 10 else None
            for x, y in zip(xs, ys, strict=True)]

    def linear(s: dict) -> np.ndarray:
        f = features(s)
        return np.array([f[j] @ coef[c] if coef[c] is not None else mean[c]
                         for j, c in enumerate(s["chans"].tolist())])

    screens = {"global importance": lambda s: mean[s["chans"]],
               "importance x column change": lambda s: mean[s["chans"]] * (s["change"] + 0.1),
               "per-channel linear fit": linear}
    ms = (4, 6, 8, 10, 12)
    print("| screen | " + " | ".join(f"m = {k}: top-3 found / all 3" for k in ms) + " |")
    print("|---|" + "---|" * len(ms))
    for name, score in screens.items():
        cells = []
        for k in ms:
            found = whole = 0.0
            for s in test:
                t = true_top(s)
                cand = {int(s["chans"][j]) for j in np.argsort(-score(s))[:k]}
                found += len(t & cand) / len(t)
                whole += t <= cand
            cells.append(f"{found / len(test):.3f} / {whole / len(test):.3f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\nload average after: {loadavg()}")


if __name__ == "__main__":
    main()
