"""The tables of docs/robustness.md, from exported models (ONNX Runtime, the service's tensors).

For each model folder: the channel-dropout rate and sources it was trained with, the validation
AUROC with every channel and averaged over the rows of `scehr robustness` (all channels, then
each channel group removed; the figure that chooses the rate), the same on set C, and on the
eICU demo's stays. Then set C per removed group for each model, and the paired difference in
AUROC on the same eICU test stays between each pair of models given with --pair.

Usage: .venv/bin/python -m benchmarks.robustness_table P12_DATA EICU_DATA MODEL [MODEL ...]
           [--pair A B] [--n-boot N]
(EICU_DATA converted with --feature-set physionet2012-full --split-by hospital.)
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from scehr.training.bootstrap import bootstrap_ci, format_ci, paired_bootstrap_diff
from scehr.training.external import ExportedModel, Scored
from scehr.training.metrics import auroc
from scehr.training.robustness import evaluate_missing


def run_config(notes: list[str]) -> dict[str, Any]:
    """The training config an exported model names in its notes ("trained by: ...")."""
    for n in notes:
        if n.startswith("trained by: scehr train --config "):
            path = Path(n.rsplit(" ", 1)[1])
            if path.is_file():
                return dict(json.loads(path.read_text()))
    return {}


def eicu_scores(folder: Path, eicu: Path) -> dict[str, Scored]:
    model = ExportedModel(folder)
    return {s: model.score(model.load(eicu, s)) for s in ("train", "val", "test")}


def plot(rob: dict[str, dict[str, Any]], path: Path) -> None:
    """Set C: AUROC (with CI) and mean risk per removed group, one bar colour per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(next(iter(rob.values()))["test"]["rows"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5), sharey=True)
    h = 0.8 / len(rob)
    for k, (name, r) in enumerate(rob.items()):
        rows = r["test"]["rows"]
        y = np.arange(len(groups)) + k * h
        auc = np.array([rows[g]["auroc"]["value"] for g in groups])
        err = np.array([[auc[i] - rows[g]["auroc"]["low"], rows[g]["auroc"]["high"] - auc[i]]
                        for i, g in enumerate(groups)]).T
        ax1.barh(y, auc, h, xerr=err, label=name)
        ax2.barh(y, [rows[g]["mean_risk"] for g in groups], h, label=name)
    obs = next(iter(rob.values()))["test"]["observed_rate"]
    ax2.axvline(obs, color="k", ls="--", lw=1, label=f"observed rate {obs:.3f}")
    ax1.set_xlim(0.75, 0.9)
    ax1.set_xlabel("set C AUROC (95% CI)")
    ax2.set_xlabel("set C mean risk")
    ax1.set_yticks(np.arange(len(groups)) + 0.4 - h / 2, groups)
    ax1.invert_yaxis()
    ax2.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=4, fontsize=8)
    ax1.set_title("removed from every stay")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("p12", type=Path)
    ap.add_argument("eicu", type=Path)
    ap.add_argument("models", type=Path, nargs="+")
    ap.add_argument("--pair", nargs=2, action="append", default=[], metavar=("A", "B"))
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--plot", type=Path, help="also draw set C per removed group (PNG)")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}")
    rob: dict[str, dict[str, Any]] = {}
    eicu: dict[str, dict[str, Scored]] = {}
    rows = []
    for folder in args.models:
        name = folder.name
        m = ExportedModel(folder).manifest
        rate = str(run_config(m.notes).get("channel_dropout", "?"))
        rob[name] = {s: evaluate_missing(folder, args.p12, s, n_boot=args.n_boot)
                     for s in ("val", "test")}
        eicu[name] = eicu_scores(folder, args.eicu)
        multi = " + " in m.provenance.dataset
        every = Scored.concat(list(eicu[name].values()))
        test = eicu[name]["test"]
        rows.append([
            name, rate, "PhysioNet + eICU train" if multi else "PhysioNet A+B",
            f"{rob[name]['val']['rows']['all channels']['auroc']['value']:.3f}",
            f"{rob[name]['val']['mean_auroc']:.3f}",
            format_ci(rob[name]["test"]["rows"]["all channels"]["auroc"]),
            f"{rob[name]['test']['mean_auroc']:.3f}",
            "(trained on part)" if multi else format_ci(
                bootstrap_ci(auroc, every.y, every.risk, n_boot=args.n_boot)),
            format_ci(bootstrap_ci(auroc, test.y, test.risk, n_boot=args.n_boot)),
        ])
    print("\n| model | channel dropout | trained on | val AUROC | val mean over removals | "
          "set C AUROC | set C mean over removals | eICU all 904 stays | eICU test hospitals |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    groups = list(next(iter(rob.values()))["test"]["rows"])
    print("\nSet C (AUROC, mean risk) with each group removed:\n")
    print("| removed | " + " | ".join(rob) + " |")
    print("|---|" + "---|" * len(rob))
    for g in groups:
        cells = [f"{format_ci(r['test']['rows'][g]['auroc'])}, "
                 f"{r['test']['rows'][g]['mean_risk']:.3f}" for r in rob.values()]
        print(f"| {g} | " + " | ".join(cells) + " |")
    if args.plot:
        plot(rob, args.plot)
    for a, b in args.pair:
        ta, tb = eicu[a]["test"], eicu[b]["test"]
        assert np.array_equal(ta.y, tb.y)
        d = paired_bootstrap_diff(auroc, ta.y, ta.risk, tb.risk, n_boot=args.n_boot)
        print(f"\neICU test ({len(ta.y)} stays, {int(ta.y.sum())} deaths): AUROC {a} − {b} = "
              f"{d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}], p = {d['p_value']:.3f}")


if __name__ == "__main__":
    main()
