"""Mortality models head to head on the same test stays: paired bootstrap, then subgroups.

Run: `python -m scehr.training.studies.head_to_head NAME=RUN_DIR ... [--logreg NAME=FILE.npz]`,
where each run directory holds `predictions.npz` (test stays, labels, probabilities,
demographics) and a logistic-regression file is `runs/<comparison>/logreg_predictions.npz`
(from `scehr compare`). All predictions must cover the same test stays in the same order.
Prints two markdown tables: test AUROC/AUPRC with 95% CIs and the paired difference of the
first model against each other; and test AUROC by sex and age band, to show where a model wins
or loses.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from scehr.training.bootstrap import bootstrap_ci, format_ci, paired_bootstrap_diff
from scehr.training.export import subgroup_auroc
from scehr.training.metrics import auprc, auroc


def load(named: list[str], logreg: list[str]) -> tuple[dict[str, np.ndarray], np.ndarray,
                                                        np.ndarray]:
    probs: dict[str, np.ndarray] = {}
    y = static = stays = None
    for item in named:
        name, _, path = item.partition("=")
        p = np.load(Path(path) / "predictions.npz")
        if stays is not None and not np.array_equal(p["test_stays"], stays):
            raise ValueError(f"{path}: test stays differ from the first run's")
        stays, y, static = p["test_stays"], p["test_y"][:, 0], p["test_static_raw"]
        probs[name] = p["test_probability"][:, 0]
    for item in logreg:
        name, _, path = item.partition("=")
        p = np.load(path)
        if stays is not None and not np.array_equal(p["stays"], stays):
            raise ValueError(f"{path}: test stays differ from the runs'")
        probs[name] = p["probability"][:, 0]
    if y is None or static is None:
        raise ValueError("give at least one NAME=RUN_DIR")
    return probs, y, static


def paired_table(probs: dict[str, np.ndarray], y: np.ndarray, n_boot: int = 1000) -> str:
    names = list(probs)
    lines = ["| model | test AUROC [95% CI] | test AUPRC [95% CI] | "
             "AUROC: first − this [95% CI], p | AUPRC: first − this [95% CI], p |",
             "|---|---|---|---|---|"]
    for n in names:
        cells = [format_ci(bootstrap_ci(f, y, probs[n], n_boot=n_boot)) for f in (auroc, auprc)]
        for f in (auroc, auprc):
            if n == names[0]:
                cells.append("–")
                continue
            d = paired_bootstrap_diff(f, y, probs[names[0]], probs[n], n_boot=n_boot)
            cells.append(f"{d['diff']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}], "
                         f"p = {d['p_value']:.3f}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def subgroup_table(probs: dict[str, np.ndarray], y: np.ndarray, static: np.ndarray) -> str:
    rows = {name: subgroup_auroc(y, p, static) for name, p in probs.items()}
    groups = list(next(iter(rows.values())))
    head = "| group | stays | deaths | " + " | ".join(probs) + " |"
    lines = [head, "|---|---:|---:|" + "---:|" * len(probs)]
    for g in groups:
        first = next(iter(rows.values()))[g]
        vals = [rows[n][g]["auroc"] for n in probs]
        cells = ["n/a" if v is None else f"{v:.3f}" for v in vals]
        lines.append(f"| {g} | {first['n']} | {first['positives']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="NAME=RUN_DIR")
    ap.add_argument("--logreg", action="append", default=[], metavar="NAME=FILE")
    ap.add_argument("--n-boot", type=int, default=1000)
    args = ap.parse_args()
    probs, y, static = load(args.runs, args.logreg)
    print(paired_table(probs, y, args.n_boot), end="\n\n")
    print(subgroup_table(probs, y, static))


if __name__ == "__main__":
    main()
