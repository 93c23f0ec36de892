"""Fit a model's explanation screen (`scehr.schemas.explanation_screen`) on exact occlusion.

    .venv/bin/python -m scehr.service.screen_fit models/mortality/1.3.2 \\
        --data data/physionet2012-full/in-hospital-mortality --out runs/screen-mortality.json

The training stays (`train_listfile.csv`) are prepared with the service's own `prepare(...,
occlusion=True)` and run through the model's ONNX graph, so every exact delta is the one
`explain=full` serves; per channel a ridge model predicts the delta from the channel's
features (shrunk towards the model pooled over channels, so a rare channel borrows from the
others). The target, the ridge strength and m are chosen on the validation stays
(`val_listfile.csv`): the smallest m whose run fits the padded row budget (1 + m a multiple
of `ROW_BLOCK`) and finds the whole exact top 3 of at least `--share` of them. The test set
plays no part. Writes the section as JSON; `scehr.training.reissue --explanation-screen`
puts it in a new version of the model. Runs on the service's code only (no torch).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scehr.schemas.explanation_screen import (
    FEATURE_NAMES,
    FEATURES_VERSION,
    ROW_BLOCK,
    ExplanationScreen,
    channel_features,
    rank_channels,
)
from scehr.schemas.manifest import sha256_file
from scehr.schemas.payloads import StayPayload
from scehr.service.batcher import run_chunked
from scehr.service.model import read_out
from scehr.service.offline_scoring import benchmark_payload
from scehr.service.pipeline import prepare
from scehr.service.registry import LoadedModel, load_model
from scehr.service.settings import Settings

TOP = 3
#: Candidates a stay's run can hold: 1 + m rows fill whole blocks of ROW_BLOCK.
BUDGETS = tuple(k * ROW_BLOCK - 1 for k in range(1, 5))
#: Targets tried: |Δrisk|, its logarithm (a few large deltas dominate the first), and the
#: logarithm less its stay's mean (only the order within a stay counts).
TARGETS = ("|delta risk|", "log(|delta risk| + 1e-4)",
           "log(|delta risk| + 1e-4) less its stay's mean")
RIDGE = (0.1, 1.0, 10.0)
#: Stays prepared and run together.
CHUNK = 64


@dataclass
class Occluded:
    """One stay's observed channels, their features and exact |Δrisk| (and |Δscore|, which
    breaks ties as the answers do)."""

    chans: np.ndarray
    features: np.ndarray
    dr: np.ndarray
    dp: np.ndarray

    def top(self) -> set[int]:
        """The exact top contributions, ordered as `scehr.service.responses` orders them."""
        return {int(self.chans[j]) for j in np.lexsort((-self.dp, -self.dr))[:TOP]}


def listed_stays(folder: Path, listfile: str, limit: int | None) -> list[StayPayload]:
    """The stays of a converted task folder's listfile, as the API's payloads."""
    with open(folder / listfile, newline="") as f:
        names = [r["stay"] for r in csv.DictReader(f)][:limit]
    demo: dict[str, dict[str, str]] = {}
    demo_file = folder / "train" / "demographics.csv"
    if demo_file.is_file():
        with open(demo_file, newline="") as f:
            demo = {r["stay"]: r for r in csv.DictReader(f)}
    sub = "test" if listfile.startswith("test") else "train"

    def num(v: str | None) -> float | None:
        return float(v) if v not in (None, "") else None

    out = []
    for n in names:
        d = demo.get(n, {}) if sub == "train" else {}
        age = num(d.get("age"))
        out.append(StayPayload.model_validate(benchmark_payload(
            folder / sub / n, age=None if age is None else min(age, 130.0),
            sex_male=num(d.get("sex_male")))))
    return out


def occlusions(model: LoadedModel, stays: list[StayPayload]) -> list[Occluded]:
    """Exact occlusion of every observed channel of each stay, with the screen's features."""
    spec = model.spec
    cols = spec.fs.channel_columns
    out = []
    for at in range(0, len(stays), CHUNK):
        prep = prepare(spec, stays[at : at + CHUNK], occlusion=True)
        if prep.inputs is None:
            continue
        sc = read_out(spec, run_chunked(model.run, prep.inputs, model.max_batch_size))
        x = prep.inputs.x
        n = len(prep.ok)
        row = n
        for s, chans in enumerate(prep.occluded):
            k = len(chans)
            # the stay with nothing observed, read back from its occlusion rows: each holds
            # one observed channel's columns as 'not observed' (the others already are)
            unobserved = x[s].copy()
            for j, c in enumerate(chans.tolist()):
                unobserved[:, cols[c]] = x[row + j][:, cols[c]]
            out.append(Occluded(
                chans, channel_features(x[s], unobserved, int(prep.inputs.lengths[s]), chans,
                                        spec.fs),
                np.abs(sc.risk[s, 0] - sc.risk[row : row + k, 0]),
                np.abs(sc.probability[s, 0] - sc.probability[row : row + k, 0])))
            row += k
        print(f"  {min(at + CHUNK, len(stays))}/{len(stays)} stays", end="\r", flush=True)
    print(flush=True)
    return out


def _target(dr: np.ndarray, target: str) -> np.ndarray:
    """One stay's regression target (a name of TARGETS)."""
    if target == TARGETS[0]:
        return dr
    y = np.log(dr + 1e-4)
    return y - y.mean() if target == TARGETS[2] else y


def fit_ridge(stays: list[Occluded], n_channels: int, target: str, lam: float) -> np.ndarray:
    """[channels, features]: per channel, ridge towards the pooled fit (a channel never
    observed keeps the pooled coefficients)."""
    f = len(FEATURE_NAMES)
    chans = np.concatenate([s.chans for s in stays])
    x = np.concatenate([s.features for s in stays])
    y = np.concatenate([_target(s.dr, target) for s in stays])
    scale = np.maximum(np.abs(x).max(axis=0), 1e-12)  # penalise features on a common scale
    xs = x / scale
    pooled = np.linalg.solve(xs.T @ xs + 1e-3 * len(xs) * np.eye(f), xs.T @ y)
    coef = np.tile(pooled, (n_channels, 1))
    for c in np.unique(chans).tolist():
        a, b = xs[chans == c], y[chans == c]
        coef[c] = np.linalg.solve(a.T @ a + lam * np.eye(f), a.T @ b + lam * pooled)
    return coef / scale


def found_shares(stays: list[Occluded], coef: np.ndarray, ms: tuple[int, ...]
                 ) -> dict[int, float]:
    """Per m: the share of stays whose whole exact top 3 is among the m candidates."""
    hits = dict.fromkeys(ms, 0)
    for s in stays:
        ranked = rank_channels(s.features, s.chans, coef).tolist()
        top = s.top()
        for m in ms:
            hits[m] += top <= set(ranked[:m])
    return {m: hits[m] / max(len(stays), 1) for m in ms}


def choose(train: list[Occluded], val: list[Occluded], n_channels: int
           ) -> tuple[np.ndarray, str, float, dict[int, float]]:
    """The target and ridge strength with the best validation shares at the row budgets of 8
    and 12 rows (m = 7 and 11)."""
    best = None
    for target in TARGETS:
        for lam in RIDGE:
            coef = fit_ridge(train, n_channels, target, lam)
            shares = found_shares(val, coef, BUDGETS)
            print(f"  {target}, ridge {lam:g}: " + ", ".join(
                f"m={m} {v:.3f}" for m, v in shares.items()), flush=True)
            key = (shares[BUDGETS[1]] + shares[BUDGETS[2]], shares[BUDGETS[1]])
            if best is None or key > best[0]:
                best = (key, coef, target, lam, shares)
    assert best is not None
    return best[1], best[2], best[3], best[4]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path, help="the model folder (models/<task>/<version>)")
    ap.add_argument("--data", type=Path, required=True,
                    help="the converted task folder the model was trained on (with "
                    "train_listfile.csv and val_listfile.csv)")
    ap.add_argument("--out", type=Path, required=True, help="the screen's JSON")
    ap.add_argument("--share", type=float, default=0.97,
                    help="least share of validation stays whose whole top 3 must be found")
    ap.add_argument("--train-stays", type=int, default=None, help="at most this many")
    ap.add_argument("--val-stays", type=int, default=None, help="at most this many")
    args = ap.parse_args(argv)
    folder = args.model.resolve()
    task = json.loads((folder / "manifest.json").read_text())["task"]
    model = load_model(folder, task, Settings(model_dir=folder.parent.parent, device="cpu",
                                              intra_op_threads=1))
    if len(model.spec.manifest.label_names) != 1:
        print("error: an explanation screen ranks channels for one class; this model has "
              f"{len(model.spec.manifest.label_names)}", file=sys.stderr)
        return 2
    where = f"{args.data.parent.name}/{args.data.name}"  # e.g. physionet2012-full/in-hospital-...
    runs = {}
    for split, limit in (("train", args.train_stays), ("val", args.val_stays)):
        stays = listed_stays(args.data, f"{split}_listfile.csv", limit)
        print(f"exact occlusion of {len(stays)} {split} stays ...", flush=True)
        runs[split] = occlusions(model, stays)
    n_ch = model.spec.fs.n_channels
    coef, target, lam, shares = choose(runs["train"], runs["val"], n_ch)
    enough = [m for m in BUDGETS if shares[m] >= args.share]
    if not enough:
        print(f"error: no m up to {BUDGETS[-1]} finds the whole top 3 of {args.share:.0%} of "
              f"validation stays (at m = {BUDGETS[-1]}: {shares[BUDGETS[-1]]:.3f})",
              file=sys.stderr)
        return 2
    every = found_shares(runs["val"], coef, tuple(range(1, BUDGETS[-1] + 1)))
    screen = ExplanationScreen(
        features=FEATURES_VERSION, candidates=enough[0], coefficients=coef.tolist(),
        target=f"{target}, per-channel ridge (strength {lam:g}) towards the pooled fit",
        fitted_on=f"exact occlusion of the {len(runs['train'])} stays of "
        f"{where}/train_listfile.csv",
        chosen_on=f"the {len(runs['val'])} stays of {where}/val_listfile.csv: the "
        f"smallest m with 1 + m a multiple of {ROW_BLOCK} finding the whole top 3 of at "
        f"least {args.share:.0%}",
        validation={str(m): round(v, 4) for m, v in every.items()},
        onnx_sha256=sha256_file(folder / model.spec.manifest.onnx.file))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(screen.model_dump_json(indent=1) + "\n")
    rows = [len(s.chans) for s in runs["val"]]
    print(f"wrote {args.out}: m = {screen.candidates} ({target}, ridge {lam:g}); whole top 3 "
          f"found on {every[screen.candidates]:.3f} of validation stays (median "
          f"{math.floor(np.median(rows))} observed channels)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
