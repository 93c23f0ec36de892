"""The landmark mortality model evaluated as an early-warning system on PhysioNet 2012 set C.

    .venv/bin/python -m benchmarks.landmark_evaluation --model MODEL_FOLDER
        [--data data/physionet2012-full] [--source ../shared/data/physionet2012]
        [--baseline models/mortality/1.3.2] [--out docs/risk-over-time]

Every choice (first hour, bands, calibration, uncertainty map, alert policy) was made on
validation at export and is read from the manifest's `trajectory` section; set C only reports.
Set C's stays (the converted test split) run through the exported ONNX graph with the
manifest's normalizer and static imputer; each hour's served risk is its band's calibration of
that hour's output (`scehr.training.landmark_assets.served_risks`), abstained where the data up
to the hour is below its band's minimum (as served). Reports, at hours 6, 12, 24, 36 and 48:
the share of the stays abstained, AUROC, AUPRC and ECE over the stays scored with 95 %
bootstrap CIs; SAPS-I and SOFA from set C's `Outcomes-c.txt`; the default 48-hour model's
served risk (`scehr score`, the data minimum lifted) at 48 h, paired; each hour's coverage of
the outcome sets; the alert policy's figures and the trade-off over the policy grid; and a
plot of a few real stays' trajectories. Writes `<out>.json`, `<out>-tradeoff.png` and
`<out>-stays.png`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scehr.schemas.contract import (  # noqa: E402
    ANCHOR_LOGITS_BY_HOUR,
    INPUT_LENGTHS,
    INPUT_STATIC,
    INPUT_X,
    PROBABILITY_BY_HOUR,
)
from scehr.schemas.featureset import FEATURE_SETS, FeatureSet  # noqa: E402
from scehr.schemas.manifest import Manifest, Trajectory, load_manifest  # noqa: E402
from scehr.schemas.tensorize import Normalizer, StaticImputer  # noqa: E402
from scehr.training.bootstrap import bootstrap_ci, paired_bootstrap_diff  # noqa: E402
from scehr.training.calibration import expected_calibration_error  # noqa: E402
from scehr.training.data.splits import SplitArrays, load_split  # noqa: E402
from scehr.training.landmark import REPORT_HOURS  # noqa: E402
from scehr.training.landmark_assets import (  # noqa: E402
    alert_figures,
    below_minimum,
    coverage_by_hour,
    held_by_hour,
    policy_grid,
    served_risks,
)
from scehr.training.metrics import auprc, auroc  # noqa: E402
from scehr.training.served_scores import served_scores  # noqa: E402
from scehr.training.sufficiency import split_observations  # noqa: E402

#: Variables drawn under each stay's trajectory.
SHOWN = ("heart_rate", "invasive_mean_bp", "gcs_total", "lactate")
SEED = 0


def run_graph(m: Manifest, folder: Path, test: SplitArrays) -> dict[str, np.ndarray]:
    """Every hour's probability and margin [N, T] of the test stays (first class)."""
    fs = FEATURE_SETS[m.feature_set["name"]]
    x = Normalizer.from_dict(m.normalizer).transform(test.x, test.lengths)
    feed = {INPUT_X: x.astype(np.float32), INPUT_LENGTHS: test.lengths.astype(np.int64)}
    if m.static is not None:
        feed[INPUT_STATIC] = StaticImputer.from_dict(m.static).transform(test.static_raw)
    session = ort.InferenceSession(str(folder / m.onnx.file), providers=["CPUExecutionProvider"])
    probs, margins = [], []
    for i in range(0, len(test.y), 500):
        part = {k: v[i : i + 500] for k, v in feed.items()}
        p, lg = session.run([PROBABILITY_BY_HOUR.name, ANCHOR_LOGITS_BY_HOUR.name], part)
        probs.append(p[..., 0])
        margins.append(lg[..., 0, 0] - lg[..., 0, 1])
    t = x.shape[1]
    assert t == fs.n_bins(fs.window_hours)
    return {"probability": np.concatenate(probs).astype(np.float64),
            "margin": np.concatenate(margins).astype(np.float64), "y": test.y[:, 0],
            "inside": np.arange(1, t + 1)[None, :] <= test.lengths[:, None]}


def ci(fn: Any, y: np.ndarray, p: np.ndarray, n_boot: int) -> dict[str, Any]:
    out = bootstrap_ci(fn, y, p, n_boot=n_boot, seed=SEED)
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}


def landmark_table(traj: Trajectory, preds: dict[str, np.ndarray], risks: np.ndarray,
                   n_boot: int) -> dict[int, dict[str, Any]]:
    """Per landmark hour, over the stays still there: the share abstained for too little data
    (NaN served risk) and the figures over the stays scored."""
    out: dict[int, dict[str, Any]] = {}
    for h in REPORT_HOURS:
        keep = preds["inside"][:, h - 1]
        y = preds["y"][keep]
        row: dict[str, Any] = {"n": int(keep.sum()), "deaths": int(y.sum())}
        if h < traj.first_hour:
            row["served"] = False
            row["auroc_model"] = ci(auroc, y, preds["probability"][keep, h - 1], n_boot)
        else:
            r = risks[keep, h - 1]
            scored = ~np.isnan(r)
            y, r = y[scored], r[scored]
            row.update(served=True, abstained=round(float(1 - scored.mean()), 4),
                       n_scored=int(scored.sum()), deaths_scored=int(y.sum()),
                       auroc=ci(auroc, y, r, n_boot), auprc=ci(auprc, y, r, n_boot),
                       ece=ci(expected_calibration_error, y, r, n_boot))
        out[h] = row
        print(f"  hour {h:>2}: {row}", flush=True)
    return out


def severity_scores(source: Path, stays: np.ndarray, y: np.ndarray, n_boot: int
                    ) -> dict[str, dict[str, Any]]:
    """AUROC of SAPS-I and SOFA as recorded in set C's Outcomes file (-1: not recorded)."""
    out = pd.read_csv(source / "Outcomes-c.txt").set_index("RecordID")
    ids = np.array([int(s.split("_", 1)[0]) for s in stays])
    res = {}
    for col in ("SAPS-I", "SOFA"):
        v = out[col].reindex(ids).to_numpy(dtype=np.float64)
        ok = v >= 0
        res[col] = {"n": int(ok.sum()), "auroc": ci(auroc, y[ok], v[ok], n_boot)}
    return res


def baseline_at_48(baseline: Path, data: Path, stays: np.ndarray, y: np.ndarray,
                   risk48: np.ndarray, n_boot: int) -> dict[str, Any]:
    """The default 48-hour model's served risk (`scehr score`, minimum lifted), paired, on the
    stays the landmark model scores at hour 48."""
    m = load_manifest(baseline / "manifest.json")
    got = served_scores(baseline, data, m.task, m.label_names[0], ("test",))["lifted"]
    order = {s: i for i, s in enumerate(got.stays)}
    r = got.risk[[order[s] for s in stays]]
    ok = ~np.isnan(r) & ~np.isnan(risk48)  # both scored
    diff = paired_bootstrap_diff(auroc, y[ok], risk48[ok], r[ok], n_boot=n_boot, seed=SEED)
    return {"model": f"{m.task} {m.version}", "n": int(ok.sum()),
            "auroc": ci(auroc, y[ok], r[ok], n_boot),
            "landmark_minus_baseline_auroc": {k: (round(v, 4) if isinstance(v, float) else v)
                                              for k, v in diff.items()}}


def plot_tradeoff(grid: list[tuple[Any, dict[str, Any]]], chosen: dict[str, Any], path: Path
                  ) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = np.array([f["alerts_per_patient_day"] for _, f in grid])
    yv = np.array([f["deaths_alerted"] for _, f in grid])
    fig, ax = plt.subplots(figsize=(6, 4.2))
    ax.scatter(x, yv, s=8, alpha=0.4, label="policies of the grid (set C)")
    order = np.argsort(x)
    front = np.maximum.accumulate(yv[order])
    ax.plot(x[order], front, color="C1", label="best share of deaths alerted")
    ax.scatter([chosen["alerts_per_patient_day"]], [chosen["deaths_alerted"]], color="C3",
               zorder=3, s=50, label="policy chosen on validation")
    ax.axvline(0.3, color="grey", ls=":", lw=1)
    ax.axhline(2 / 3, color="grey", ls=":", lw=1)
    ax.set_xlabel("alerts per patient-day")
    ax.set_ylabel("share of deaths alerted at some hour <= 48")
    ax.set_title("Alert trade-off on set C")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def observed_values(fs: FeatureSet, c: int, x: np.ndarray) -> np.ndarray:
    """Channel c's values at the given steps (a categorical channel's category, as a number)."""
    v, b = fs.variables[c], int(fs.begins[c])
    if not v.is_categorical:
        return x[:, b]
    return np.array([float(v.categories[k]) for k in x[:, b : b + int(fs.widths[c])].argmax(1)])


def plot_stays(traj: Trajectory, test: SplitArrays, fs: FeatureSet, risks: np.ndarray,
               path: Path) -> list[str]:
    """The first two deaths and the first two survivors of set C (by RecordID): served risk
    with its interval and alerts, over four of the stay's observed variables."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from scehr.schemas.alert_policy import alert_hours

    order = np.argsort([int(s.split("_", 1)[0]) for s in test.stays])
    died = test.y[order, 0] > 0.5
    picks = [*order[died][:2], *order[~died][:2]]
    ids = [v.id for v in fs.variables]
    fig, axes = plt.subplots(2, len(picks), figsize=(4 * len(picks), 6), sharex=True,
                             gridspec_kw={"height_ratios": [3, 2]})
    hours = np.arange(1, risks.shape[1] + 1)
    for k, i in enumerate(picks):
        ax = axes[0, k]
        r = risks[i]
        lo, hi = np.full_like(r, np.nan), np.full_like(r, np.nan)
        for b in traj.bands:
            cols = np.arange(b.from_hour - 1, b.to_hour)
            if b.uncertainty is not None:
                lo[cols], hi[cols] = b.uncertainty.interval(np.nan_to_num(r[cols], nan=0.5))
        lo[np.isnan(r)] = hi[np.isnan(r)] = np.nan
        ax.fill_between(hours, lo, hi, alpha=0.25, color="C0", label="Venn-Abers interval")
        ax.plot(hours, r, color="C0", label="served risk")
        al = alert_hours(traj.alert_policy, hours.tolist(),
                         [None if np.isnan(v) else float(v) for v in r])
        ax.scatter(al, r[np.array(al, dtype=int) - 1] if al else [], color="C3", zorder=3,
                   label="alert")
        ax.axhline(traj.alert_policy.threshold, color="C3", ls=":", lw=1)
        ax.set_ylim(0, 1)
        ax.set_title(f"set C stay {k + 1}: {'died' if k < 2 else 'survived'} in hospital")
        if k == 0:
            ax.set_ylabel("risk of in-hospital death")
            ax.legend(fontsize=7, loc="upper left")
        bx = axes[1, k]
        for j, vid in enumerate(SHOWN):
            if vid not in ids:
                continue
            c = ids.index(vid)
            seen = test.x[i, :, fs.n_value_columns + c] > 0.5
            vals = observed_values(fs, c, test.x[i, seen])
            scale = np.nanmax(np.abs(vals)) if seen.any() else 1.0
            bx.plot(hours[seen], vals / (scale or 1.0) + j * 1.2, ".-", ms=3, lw=0.8,
                    label=f"{vid} (max {scale:.3g})")
        bx.set_yticks([])
        bx.set_xlabel("hour of the stay")
        bx.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [str(test.stays[i]).split("_", 1)[0] for i in picks]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="an exported landmark model")
    ap.add_argument("--data", type=Path, default=REPO / "data" / "physionet2012-full",
                    help="the converted PhysioNet 2012 folder the model was trained on")
    ap.add_argument("--source", type=Path, default=REPO.parent / "shared" / "data" /
                    "physionet2012", help="the raw PhysioNet 2012 folder (Outcomes-c.txt)")
    ap.add_argument("--baseline", type=Path, default=REPO / "models" / "mortality" / "1.3.2")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "risk-over-time")
    ap.add_argument("--n-boot", type=int, default=1000)
    args = ap.parse_args(argv)
    m = load_manifest(args.model / "manifest.json")
    traj = m.trajectory
    if traj is None:
        raise SystemExit(f"{args.model} is not a landmark model (no trajectory section)")
    fs = FEATURE_SETS[m.feature_set["name"]]
    test = load_split(args.data, m.task, "test", fs)
    print(f"{m.name} {m.version}: {len(test.y)} set-C stays", flush=True)
    preds = run_graph(m, args.model, test)
    risks = served_risks(traj, preds)
    held = held_by_hour(split_observations([args.data], test), len(test), risks.shape[1], fs)
    risks[below_minimum(traj, held)] = np.nan  # the hours the service abstains at
    y = preds["y"]
    table = landmark_table(traj, preds, risks, args.n_boot)
    policy = alert_figures(traj.alert_policy, risks, y)
    grid = policy_grid(risks, y)
    print("policy on set C:", policy, flush=True)
    res = {
        "model": {"name": m.name, "version": m.version, "first_hour": traj.first_hour,
                  "bands": [[b.from_hour, b.to_hour] for b in traj.bands],
                  "alert_policy": traj.alert_policy.model_dump()},
        "landmarks": table,
        "severity_scores": severity_scores(args.source, test.stays, y, args.n_boot),
        "baseline_48h": baseline_at_48(args.baseline, args.data, test.stays, y,
                                       risks[:, -1], args.n_boot),
        "coverage_by_hour": coverage_by_hour(traj, preds, "set C"),
        "alert_policy_on_test": policy,
        "tradeoff": [{"threshold": p.threshold, "silence_hours": p.silence_hours,
                      "realert_rise": p.realert_rise, **f} for p, f in grid],
    }
    plot_tradeoff(grid, policy, Path(f"{args.out}-tradeoff.png"))
    res["plotted_stays"] = plot_stays(traj, test, fs, risks, Path(f"{args.out}-stays.png"))
    Path(f"{args.out}.json").write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}.json, {args.out}-tradeoff.png and {args.out}-stays.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
