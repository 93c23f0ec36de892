"""How much data does a phenotypes stay need? The shipped model on eICU validation stays.

    .venv/bin/python -m benchmarks.sufficiency_phenotypes [--model models/phenotypes/1.1.1]
        --data data/eicu-benchmark/phenotyping [--out docs/sufficiency-phenotypes]

(after `scehr data convert-eicu-demo ../shared/data/eicu-demo data/eicu-benchmark`)

The data folder is the eICU demo converted as the model's provenance says
(`scehr.training.data.eicu_demo`, seed 0, split by patient); the validation and test stays are the
converter's `val_listfile.csv` and `test/listfile.csv`. Each stay's window is the whole stay
(its `period_length`, capped at the feature set's 240 h), as in training and as the service
sets it from `end_hours`. Data are removed as in `benchmarks.sufficiency_study` except the
time rule: a whole-stay model has no fixed window end, so "hours covered" keeps the first h
hours of the stay (the window still ends at the stay's end). Figures are micro-AUROC over the
25 classes, the micro ECE (all stay x class risks in 10 bins) and a stay-level bootstrap
interval (200 resamples) for both, because 223 validation stays give wide intervals.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.sufficiency_study import SEED, Model, degrade, write_report  # noqa: E402
from scehr.schemas.sufficiency import DataMinimum, SplitFigures, shortfalls, summarize  # noqa: E402
from scehr.schemas.tensorize import Observations  # noqa: E402

LEVELS = {
    "observations": [1, 2, 3, 5, 10, 20, 50, 100, 200],
    "channels": [1, 2, 3, 4, 6, 8, 10],
    "hours_covered": [1, 2, 4, 6, 12, 24, 48],
}
BOOT = 200
AUROC_DROP = 0.05  # as for mortality: the most micro-AUROC a stay at the minimum may lose
ECE_FACTOR = 2.0  # micro-ECE is small for rare classes: compare with the full stays'


def load(tdir: Path, model: Model, split: str
         ) -> tuple[Observations, np.ndarray, np.ndarray, np.ndarray]:
    """(observations, static_raw, labels [n, 25], window end per stay) of one split."""
    from scehr.training.data.reader import labels, read_demographics, read_timeseries, resolve_split

    spec = resolve_split(tdir, "phenotypes", split)
    stays = spec.table["stay"].tolist()
    obs, _ = read_timeseries([spec.files_dir / s for s in stays], model.fs, progress=False)
    static = read_demographics(spec.demographics, stays)
    end = np.minimum(spec.table["period_length"].to_numpy(np.float64), model.fs.max_hours)
    return obs, static, labels(spec.table, "phenotypes").astype(np.float64), end


def figures(y: np.ndarray, risk: np.ndarray, boot: bool = False) -> dict[str, float]:
    """Micro-AUROC and micro-ECE; with `boot`, their 95% stay-bootstrap intervals."""
    from scehr.training.calibration import expected_calibration_error
    from scehr.training.metrics import micro_auroc

    def one(idx: np.ndarray) -> tuple[float, float]:
        return (float(micro_auroc(y[idx], risk[idx])),
                float(expected_calibration_error(y[idx].ravel(), risk[idx].ravel())))

    a, e = one(np.arange(len(y)))
    out = {"auroc": a, "ece": e}
    if boot:
        rng = np.random.default_rng(SEED)
        draws = np.array([one(rng.integers(0, len(y), len(y))) for _ in range(BOOT)])
        out |= {"auroc_low": float(np.quantile(draws[:, 0], 0.025)),
                "auroc_high": float(np.quantile(draws[:, 0], 0.975)),
                "ece_low": float(np.quantile(draws[:, 1], 0.025)),
                "ece_high": float(np.quantile(draws[:, 1], 0.975))}
    return out


def study(model: Model, obs: Observations, static: np.ndarray, y: np.ndarray,
          end: np.ndarray) -> dict[str, list[dict[str, float]]]:
    full = model.risks(obs, static, end)
    res: dict[str, list[dict[str, float]]] = {"full": [figures(y, full, boot=True)]}
    print(f"  full: {res['full'][0]}", flush=True)
    for how, levels in LEVELS.items():
        rows = []
        for level in levels:
            if how == "hours_covered":  # the first `level` hours of each stay
                d = obs.take(obs.time <= level + 1e-6)
            else:
                d = degrade(obs, model.fs, how, level, float(model.fs.max_hours),
                            np.random.default_rng(SEED))
            r = model.risks(d, static, end)
            rows.append({"level": level, **figures(y, r, boot=True),
                         "median_abs_risk_change": float(np.median(np.abs(r - full)))})
            row = rows[-1]
            print(f"  {how:>14} {level:>5g}: micro-AUROC {row['auroc']:.3f} "
                  f"[{row['auroc_low']:.3f}, {row['auroc_high']:.3f}]  ECE {row['ece']:.4f} "
                  f"[{row['ece_low']:.4f}, {row['ece_high']:.4f}]  median |Δrisk| "
                  f"{row['median_abs_risk_change']:.4f}", flush=True)
        res[how] = rows
    return res


def on_split(model: Model, minimum: DataMinimum, obs: Observations, static: np.ndarray,
             y: np.ndarray, end: np.ndarray) -> SplitFigures:
    risk = model.risks(obs, static, end)
    kept = np.array([not shortfalls(s, minimum) for s in summarize(obs, end, model.fs)])
    f = figures(y[kept], risk[kept])
    return SplitFigures(n=len(y), kept=int(kept.sum()), auroc=round(f["auroc"], 4),
                        ece=round(f["ece"], 4), auroc_all=round(figures(y, risk)["auroc"], 4))


def choose(res: dict[str, list[dict[str, float]]]) -> dict[str, float | None]:
    """Per way of removing data, the least level from which, at it and every level with more
    data, the micro-AUROC's bootstrap lower bound stays within `AUROC_DROP` of the full
    stays' micro-AUROC and the micro-ECE at most `ECE_FACTOR` times the full stays'."""
    ref = res["full"][0]

    def ok(row: dict[str, float]) -> bool:
        return (row["auroc_low"] >= ref["auroc"] - AUROC_DROP
                and row["ece"] <= ECE_FACTOR * ref["ece"])

    chosen: dict[str, float | None] = {}
    for how in LEVELS:
        rows = res[how]
        chosen[how] = next((r["level"] for i, r in enumerate(rows)
                            if all(ok(r2) for r2 in rows[i:])), None)
    return chosen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=REPO / "models" / "phenotypes" / "1.1.1")
    ap.add_argument("--data", type=Path, required=True,
                    help="the phenotyping folder of the eICU demo converted by `scehr data`")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "sufficiency-phenotypes")
    args = ap.parse_args(argv)
    model = Model(args.model)
    val = load(args.data, model, "val")
    print(f"sufficiency study: {model.m.name} {model.m.version}; validation: {len(val[2])} "
          f"stays, {int(val[2].sum())} positive labels", flush=True)
    res = study(model, *val)
    pick = choose(res)
    print("chosen on validation:", pick, flush=True)
    minimum = DataMinimum(
        min_observations=int(pick["observations"] or 1),
        min_channels=int(pick["channels"] or 1),
        min_hours_covered=float(pick["hours_covered"] or 0.0),
        max_hours_since_last=None,
        rule=(f"per way of removing data, the least data from which the validation "
              f"micro-AUROC's 95% bootstrap lower bound stays within {AUROC_DROP:g} of the "
              f"full stays' micro-AUROC and the micro-ECE at most {ECE_FACTOR:g} times theirs "
              f"(validation, {len(val[2])} stays; benchmarks/sufficiency_phenotypes.py); no "
              f"bound on hours since the last observation: a whole-stay window ends at the "
              f"stay's end"),
        study="docs/sufficiency.md")
    minimum.validation = on_split(model, minimum, *val)
    minimum.test = on_split(model, minimum, *load(args.data, model, "test"))
    write_report(model, res, pick, minimum, args.out)
    print(f"wrote {args.out}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
