"""Classical baselines on a converted mortality dataset: logistic regression and gradient
boosting on 48-hour summary statistics, chosen on validation, reported on test with 95%
bootstrap CIs and the Challenge 2012 scores (Event 1 at a validation threshold, Event 2).

Usage: .venv/bin/python -m benchmarks.classical_baselines [DATA]
       (default data/physionet2012-benchmark, from `scehr data convert-physionet2012`)
"""

from __future__ import annotations

import sys
import time

from training.baseline import baseline_predictions, fit_gbm_baseline, fit_logistic_baseline
from training.bootstrap import bootstrap_metrics, format_ci
from training.challenge2012 import challenge_scores
from training.data.splits import load_split


def main() -> None:
    data = sys.argv[1] if len(sys.argv) > 1 else "data/physionet2012-benchmark"
    tr, va, te = (load_split(data, "mortality", s) for s in ("train", "val", "test"))
    for fit in (fit_logistic_baseline, fit_gbm_baseline):
        t0 = time.perf_counter()
        model = fit(tr, va)
        p = baseline_predictions(model, te)["probability"][:, 0]
        pv = baseline_predictions(model, va)["probability"][:, 0]
        ci = bootstrap_metrics("mortality", te.y[:, 0], p, n_boot=1000)
        ch = challenge_scores(va.y[:, 0], pv, te.y[:, 0], p, n_boot=200)
        s = model.summary()
        print(f"{s['model']} {s.get('params', s['C'])}: val {max(model.val_scores.values()):.3f}"
              f"  test AUROC {format_ci(ci['auroc'])}  AUPRC {format_ci(ci['auprc'])}"
              f"  Event 1 {format_ci(ch['event1'])} (best on test "
              f"{ch['event1_best_threshold_on_test']['value']:.3f})"
              f"  Event 2 H {ch['event2_h_normalized']['value']:.1f}"
              f"  {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
