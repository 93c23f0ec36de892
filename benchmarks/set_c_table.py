"""The set-C table of docs/results.md: trained runs vs the classical baselines.

For each run directory (trained on PhysioNet 2012 A+B with `scehr train`, or an ensemble run of
`scehr ensemble`), on set C and on the risk the service would show (the run's calibration map,
fitted as `scehr export` fits it): AUROC, AUPRC and ECE (10 equal-width bins) with 95%
bootstrap CIs, the Challenge 2012 Event 1 (threshold chosen on validation: the `balanced`
point) and Event 2 (normalised Hosmer-Lemeshow H). The logistic regression and gradient boosting of
`scehr.training.studies.baseline` are fitted on the same splits; the one with the better validation
AUROC is "the best classical model", and every run is compared with it by a paired bootstrap of
the test AUROC (same resampled stays for both). Runs of one configuration with several seeds are
also averaged into an equal-weight mean of their risks (reported, not a shipped model).

Usage: .venv/bin/python -m benchmarks.set_c_table DATA RUN_DIR [RUN_DIR ...] [--n-boot N]
           [--feature-set NAME]   (the baselines' input; the runs carry their own)
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import numpy as np

from scehr.schemas.featureset import FEATURE_SETS
from scehr.training.bootstrap import (
    bootstrap_ci,
    bootstrap_metrics,
    format_ci,
    paired_bootstrap_diff,
)
from scehr.training.calibration import expected_calibration_error
from scehr.training.challenge2012 import challenge_scores
from scehr.training.data.splits import load_split
from scehr.training.evaluate import (
    challenge2012_scores,
    load_predictions,
    load_run_config,
    served_risk,
)
from scehr.training.metrics import auroc
from scehr.training.studies.baseline import (
    baseline_predictions,
    fit_gbm_baseline,
    fit_logistic_baseline,
)


def run_rows(run_dir: Path, n_boot: int) -> dict[str, Any]:
    cfg = load_run_config(run_dir)
    preds = load_predictions(run_dir)
    ch = challenge2012_scores(cfg, preds, n_boot, seed=0)
    risk = served_risk(cfg, preds)
    return {"name": run_dir.name, "stays": preds["test"]["stays"],
            "val_auroc": auroc(preds["val"]["y"][:, 0], preds["val"]["probability"][:, 0]),
            "y": preds["test"]["y"][:, 0],
            "p": risk["test"][:, 0] if risk is not None else preds["test"]["probability"][:, 0],
            "challenge": ch.get("risk", ch["uncalibrated_probability"]),
            "scored_on": "risk" if "risk" in ch else "probability"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--feature-set", default="benchmark76-48h", choices=list(FEATURE_SETS))
    args = ap.parse_args()
    fs = FEATURE_SETS[args.feature_set]
    tr, va, te = (load_split(args.data, "mortality", s, fs) for s in ("train", "val", "test"))
    rows: list[dict[str, Any]] = []
    for fit in (fit_logistic_baseline, fit_gbm_baseline):
        model = fit(tr, va)
        p = baseline_predictions(model, te)["probability"][:, 0]
        pv = baseline_predictions(model, va)["probability"][:, 0]
        rows.append({"name": model.summary()["model"], "stays": te.stays, "p": p,
                     "y": te.y[:, 0], "val_auroc": max(model.val_scores.values()),
                     "challenge": challenge_scores(va.y[:, 0], pv, te.y[:, 0], p,
                                                   n_boot=args.n_boot),
                     "scored_on": "probability", "classical": True})
    best = max((r for r in rows if r.get("classical")), key=lambda r: r["val_auroc"])
    runs = [run_rows(r, args.n_boot) for r in args.runs]
    for r in runs:
        if not np.array_equal(r["stays"], best["stays"]):
            raise SystemExit(f"{r['name']}: its test stays differ from {args.data}'s test split")
    rows += runs
    by_config: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by_config.setdefault(re.sub(r"-s\d+$", "", r["name"]), []).append(r)
    for name, group in by_config.items():
        if len(group) > 1:
            p = np.mean([r["p"] for r in group], axis=0)
            rows.append({"name": f"{name} (mean of {len(group)} seeds)", "stays": best["stays"],
                         "y": best["y"], "p": p,
                         "val_auroc": float("nan"), "challenge": None, "scored_on": "-"})
    print(f"best classical model on validation: {best['name']} (val AUROC "
          f"{best['val_auroc']:.3f})\n")
    print("| model | val AUROC | test AUROC [95% CI] | AUPRC | Event 1 | Event 2 (H) | ECE | "
          f"Δ AUROC vs {best['name']} [95% CI], p |")
    print("|---|---:|---|---|---|---|---|---|")
    for r in rows:
        ci = bootstrap_metrics("mortality", r["y"], r["p"], n_boot=args.n_boot)
        ch = r["challenge"]
        e1 = format_ci(ch["event1"]) if ch else "n/a"
        e2 = format_ci(ch["event2_h_normalized"], 1) if ch else "n/a"
        ece = format_ci(bootstrap_ci(expected_calibration_error, r["y"], r["p"],
                                     n_boot=args.n_boot))
        if r is best:
            diff = "reference"
        else:
            d = paired_bootstrap_diff(auroc, r["y"], r["p"], best["p"], n_boot=args.n_boot)
            diff = f"{d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}], p={d['p_value']:.3f}"
        print(f"| {r['name']} | {r['val_auroc']:.3f} | {format_ci(ci['auroc'])} | "
              f"{format_ci(ci['auprc'])} | {e1} | {e2} | {ece} | {diff} |")
    print("\nscored on: " + ", ".join(f"{r['name']}: {r['scored_on']}" for r in rows
                                                 if r["challenge"]))


if __name__ == "__main__":
    main()
