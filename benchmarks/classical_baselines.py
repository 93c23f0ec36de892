"""Classical baselines on a converted PhysioNet 2012 mortality dataset, on either feature set:
logistic regression and gradient boosting on 48-hour summary statistics (per variable first, last,
min, max, mean, last - first, slope and count of observed hours, so a count of 0 marks a variable as
missing; category shares for GCS and ICU type; age and sex with missing flags;
`scehr.training.studies.baseline`). The regularisation C and the boosting grid point are chosen on
the validation split (15% of sets a+b), the models are fitted on the rest of sets a+b, and set c is
only reported: AUROC/AUPRC with 95% bootstrap CIs and the Challenge 2012 scores (Event 1 at the
validation-chosen threshold, and the best on test for reference; Event 2 on the model's
probability).

Usage:
    nice -n 5 .venv/bin/python -m benchmarks.classical_baselines --feature-set physionet2012-full \
        data-own/physionet2012-full
    nice -n 5 .venv/bin/python -m benchmarks.classical_baselines --feature-set benchmark76-48h \
        data-own/physionet2012-benchmark

DATA comes from `scehr data convert-physionet2012 SRC DATA --feature-set NAME`. Predictions
(stay, label, probability per model and split) and the summary are written to `--out`
(default `runs/classical-baselines/<feature set>/`) for paired comparisons.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from scehr.schemas.featureset import FEATURE_SETS
from scehr.training.bootstrap import bootstrap_metrics, format_ci
from scehr.training.challenge2012 import challenge_scores
from scehr.training.data.splits import load_split
from scehr.training.studies.baseline import (
    baseline_predictions,
    fit_gbm_baseline,
    fit_logistic_baseline,
)

#: C values tried for the logistic regression (validation AUROC picks one).
C_GRID: tuple[float, ...] = (0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
#: Gradient-boosting grid: learning rate x tree size (early stopping sets the tree count).
GBM_GRID: tuple[dict[str, float], ...] = tuple(
    {"learning_rate": lr, "max_leaf_nodes": leaves}
    for lr in (0.03, 0.1) for leaves in (7, 15, 31))


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", type=Path, nargs="?", default=None,
                   help="converted dataset (default data/physionet2012-benchmark for the "
                   "benchmark set, data/physionet2012-full for the full set)")
    p.add_argument("--feature-set", choices=[n for n, f in FEATURE_SETS.items()
                                             if f.window_hours == 48.0],
                   default="benchmark76-48h", help="the dataset's feature set")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap replicates for CIs")
    p.add_argument("--out", type=Path, default=None, help="folder for predictions and summary")
    return p.parse_args(argv)


def _default_data(feature_set: str) -> Path:
    name = "physionet2012-full" if feature_set == "physionet2012-full" else \
        "physionet2012-benchmark"
    return Path("data") / name


def run(data: Path, feature_set: str, n_boot: int, out: Path) -> list[dict[str, Any]]:
    """Fit both models, score them on test, write predictions and the summary; returns rows."""
    fs = FEATURE_SETS[feature_set]
    prov = data / "provenance.json"
    written = json.loads(prov.read_text()).get("feature_set", {}).get(
        "name", "benchmark76-48h") if prov.is_file() else feature_set
    if written != feature_set:
        raise ValueError(f"{data} was converted with --feature-set {written}, not {feature_set}")
    print(f"loading {data} ({feature_set}) ...", flush=True)
    tr, va, te = (load_split(data, "mortality", s, fs) for s in ("train", "val", "test"))
    print(f"train {len(tr)}, val {len(va)}, test {len(te)} stays; "
          f"{fs.n_channels} variables", flush=True)
    rows: list[dict[str, Any]] = []
    preds: list[pd.DataFrame] = []
    fits = (("logistic_regression", lambda: fit_logistic_baseline(tr, va, c_grid=C_GRID)),
            ("gradient_boosting", lambda: fit_gbm_baseline(tr, va, grid=GBM_GRID)))
    for name, fit in fits:
        t0 = time.perf_counter()
        print(f"{name}: fitting the grid on train, choosing on validation ...", flush=True)
        model = fit()
        pv = baseline_predictions(model, va)["probability"][:, 0]
        pt = baseline_predictions(model, te)["probability"][:, 0]
        ci = bootstrap_metrics("mortality", te.y[:, 0], pt, n_boot=n_boot)
        ch = challenge_scores(va.y[:, 0], pv, te.y[:, 0], pt, n_boot=n_boot)
        s = model.summary()
        row = {"model": name, "feature_set": feature_set, "chosen": s.get("params", s["C"]),
               "val_auroc": max(model.val_scores.values()), "n_features": s["n_features"],
               "test_auroc": ci["auroc"], "test_auprc": ci["auprc"], **ch,
               "seconds": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        print(f"  chosen {row['chosen']} (val AUROC {row['val_auroc']:.3f}); test AUROC "
              f"{format_ci(ci['auroc'])}, AUPRC {format_ci(ci['auprc'])}, Event 1 "
              f"{format_ci(ch['event1'])} at {ch['event1_threshold']:.3f} (best on test "
              f"{ch['event1_best_threshold_on_test']['value']:.3f}), Event 2 H "
              f"{format_ci(ch['event2_h_normalized'], 1)}; {row['seconds']:.0f} s", flush=True)
        for split, a, p in (("val", va, pv), ("test", te, pt)):
            preds.append(pd.DataFrame({"model": name, "split": split, "stay": a.stays,
                                       "y_true": a.y[:, 0].astype(int), "probability": p}))
    out.mkdir(parents=True, exist_ok=True)
    pd.concat(preds).to_csv(out / "predictions.csv", index=False)
    (out / "summary.json").write_text(json.dumps(rows, indent=1, default=float) + "\n")
    print(f"wrote {out / 'predictions.csv'} and {out / 'summary.json'}")
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """The results as a table row per model (docs/results.md style)."""
    lines = ["| model | feature set | test AUROC | test AUPRC | Event 1 (val threshold) | "
             "Event 1 best on test | Event 2 H (Challenge scale) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['feature_set']} | {format_ci(r['test_auroc'])} | "
                     f"{format_ci(r['test_auprc'])} | {format_ci(r['event1'])} | "
                     f"{r['event1_best_threshold_on_test']['value']:.3f} | "
                     f"{format_ci(r['event2_h_normalized'], 1)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    data = args.data or _default_data(args.feature_set)
    out = args.out or Path("runs") / "classical-baselines" / args.feature_set
    try:
        rows = run(data, args.feature_set, args.n_boot, out)
    except (FileNotFoundError, NotADirectoryError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print()
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
