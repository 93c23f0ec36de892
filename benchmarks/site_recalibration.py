"""Site recalibration on the eICU demo, five folds by hospital: the shipped model against the
site models `scehr recalibrate` makes, on hospitals neither saw.

The eICU demo's mortality stays (all its splits) are dealt into five folds of hospitals
(hospitals sharing a patient stay together; each group of hospitals goes, in seeded order, to
the fold with the fewest stays so far). For each fold, a site model is fitted on the four
other folds with `scehr.training.site_model.fit_site_model` (the function `scehr recalibrate`
runs: its own seeded split, maps and points on its fitting part), and both models score the
fold's stays that meet the data minimum. The figures are pooled over the five folds, with 95 %
bootstrap CIs; the targets (docs/hospital.md) are checked at the end.

    scehr data convert-eicu-demo ../shared/data/eicu-demo data/eicu-full \\
        --feature-set physionet2012-full
    .venv/bin/python -m benchmarks.site_recalibration data/eicu-full
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scehr.schemas.manifest import ClassCard
from scehr.training.bootstrap import bootstrap_ci, format_ci
from scehr.training.calibration import expected_calibration_error
from scehr.training.data.eicu_demo import hospital_groups
from scehr.training.data.layout import DEMOGRAPHICS_FILE, task_dir
from scehr.training.external import ExportedModel
from scehr.training.metrics import auroc
from scehr.training.site_model import SiteStays, fit_site_model, read_site

POINTS = ("high_sensitivity", "balanced", "high_ppv")
#: The targets: coverage of the 90 % sets on held-out stays, of the deaths, held-out ECE.
COVERAGE_RANGE = (0.88, 0.92)
MIN_DEATH_COVERAGE = 0.85
MAX_ECE = 0.03


def hospitals(data: Path, names: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hospital id, patient id) per stay "<split>/<file>", from the converter's
    demographics files (the val split's stays live in train/)."""
    tdir = task_dir(data, "mortality")
    demo = pd.concat([pd.read_csv(tdir / d / DEMOGRAPHICS_FILE) for d in ("train", "test")])
    by = demo.set_index("stay")
    files = [n.split("/", 1)[1] for n in names]
    return (by.loc[files, "hospitalid"].astype(str).to_numpy(),
            by.loc[files, "uniquepid"].astype(str).to_numpy())


def hospital_folds(hosp: np.ndarray, patients: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Fold 0..k-1 per stay: groups of hospitals (joined by shared patients), in seeded order,
    each to the fold with the fewest stays so far."""
    group = hospital_groups(hosp, patients)
    names, counts = np.unique(group, return_counts=True)
    order = np.random.default_rng(seed).permutation(len(names))
    size, of = np.zeros(k, dtype=int), {}
    for i in order:
        f = int(np.argmin(size))
        of[names[i]] = f
        size[f] += counts[i]
    return np.array([of[g] for g in group])


def alerts(card: ClassCard, risk: np.ndarray) -> dict[str, np.ndarray]:
    return {p.name: risk >= p.threshold for p in card.named_points}


def run(folder: Path, data: Path, k: int, seed: int, n_boot: int) -> dict[str, Any]:
    model = ExportedModel(folder)
    print(f"scoring {data} with {folder} ...", flush=True)
    stays = read_site(model, data)
    hosp, pids = hospitals(data, stays.names)
    fold = hospital_folds(hosp, pids, k, seed)
    pooled: dict[str, list[np.ndarray]] = {key: [] for key in (
        "y", "shipped", "site", "shipped_covered", "site_covered")}
    alert_lists: dict[str, dict[str, list[np.ndarray]]] = {"shipped": {}, "site": {}}
    folds = []
    for f in range(k):
        site: SiteStays = stays.take(fold != f)
        fitted = fit_site_model(model, site, f"eICU demo folds other than {f}", seed=seed,
                                n_boot=50)
        card = fitted.card
        test = stays.take((fold == f) & stays.meets).scored
        r_site = card.calibration.apply(test.probability, test.margin)
        for key, v in (("y", test.y), ("shipped", test.risk), ("site", r_site),
                       ("shipped_covered", model.card.uncertainty.covered(test.y, test.risk)),
                       ("site_covered", card.uncertainty.covered(test.y, r_site))):
            pooled[key].append(v)
        n = len(test.y)
        for who, c, r in (("shipped", model.card, test.risk), ("site", card, r_site)):
            got = alerts(c, r)
            for name in POINTS:  # a withheld point alerts for no one
                alert_lists[who].setdefault(name, []).append(got.get(name, np.zeros(n, bool)))
        folds.append({
            "fold": f, "hospitals": len(set(hosp[fold == f])), "stays": int((fold == f).sum()),
            "scored": n, "deaths": int(test.y.sum()),
            "calibration": card.calibration.method,
            "points": {p.name: round(p.threshold, 4) for p in card.named_points},
            "withheld": {w.name: w.reason for w in card.withheld_points},
            "levels": card.levels.model_dump() if card.levels else None,
            "coverage": float(pooled["site_covered"][-1].mean()),
            "coverage_deaths": float(pooled["site_covered"][-1][test.y > 0.5].mean())})
        print(f"  fold {f}: {folds[-1]['hospitals']} hospitals, {n} scored stays "
              f"({folds[-1]['deaths']} deaths); site map {card.calibration.method}, points "
              f"{folds[-1]['points']}, withheld {list(folds[-1]['withheld'])}", flush=True)
    y = np.concatenate(pooled["y"])
    table: dict[str, Any] = {"stays": len(stays.names), "scored": len(y), "deaths": int(y.sum()),
                             "abstention_rate": float(1 - stays.meets.mean())}
    for who in ("shipped", "site"):
        r = np.concatenate(pooled[who])
        cov = np.concatenate(pooled[f"{who}_covered"]).astype(np.float64)
        table[who] = {
            "auroc": bootstrap_ci(auroc, y, r, n_boot=n_boot, seed=seed),
            "ece": bootstrap_ci(expected_calibration_error, y, r, n_boot=n_boot, seed=seed),
            "coverage": bootstrap_ci(lambda yy, c: c.mean(), y, cov, n_boot=n_boot, seed=seed),
            "coverage_deaths": bootstrap_ci(lambda yy, c: c[yy > 0.5].mean(), y, cov,
                                            n_boot=n_boot, seed=seed),
            "coverage_survivors": bootstrap_ci(lambda yy, c: c[yy <= 0.5].mean(), y, cov,
                                               n_boot=n_boot, seed=seed),
            "alert_rate": {name: float(np.concatenate(alert_lists[who][name]).mean())
                           for name in POINTS}}
    return {"model": str(folder), "data": str(data), "folds": folds, "pooled": table}


def targets(res: dict[str, Any]) -> list[str]:
    """Each target with its figure and whether it is met."""
    site = res["pooled"]["site"]
    cov, deaths, ece = (site[k]["value"] for k in ("coverage", "coverage_deaths", "ece"))
    lo, hi = COVERAGE_RANGE
    every = all(set(f["points"]) | set(f["withheld"]) >= set(POINTS) for f in res["folds"])
    return [f"{'met' if lo <= cov <= hi else 'MISSED'}: coverage of held-out stays "
            f"{100 * cov:.1f} % (target {100 * lo:.0f}-{100 * hi:.0f} %)",
            f"{'met' if deaths >= MIN_DEATH_COVERAGE else 'MISSED'}: coverage of the deaths "
            f"{100 * deaths:.1f} % (target >= {100 * MIN_DEATH_COVERAGE:.0f} %)",
            f"{'met' if ece <= MAX_ECE else 'MISSED'}: held-out ECE {ece:.3f} (target <= "
            f"{MAX_ECE})",
            f"{'met' if every else 'MISSED'}: every named point of the parent exists in each "
            "site model or is withheld with its reason"]


def markdown(res: dict[str, Any]) -> str:
    p = res["pooled"]
    sh, si = p["shipped"], p["site"]

    def pct(ci: dict[str, Any]) -> str:
        return (f"{100 * ci['value']:.1f} % [{100 * ci['low']:.1f}, {100 * ci['high']:.1f}]"
                if ci["value"] is not None else "n/a")

    rows = [("AUROC", format_ci(sh["auroc"]), format_ci(si["auroc"])),
            ("ECE", format_ci(sh["ece"]), format_ci(si["ece"])),
            ("90 % sets: coverage, all stays", pct(sh["coverage"]), pct(si["coverage"])),
            ("90 % sets: coverage, deaths", pct(sh["coverage_deaths"]),
             pct(si["coverage_deaths"])),
            ("90 % sets: coverage, survivors", pct(sh["coverage_survivors"]),
             pct(si["coverage_survivors"]))]
    rows += [(f"alert rate `{n}`", f"{100 * sh['alert_rate'][n]:.1f} %",
              f"{100 * si['alert_rate'][n]:.1f} %") for n in POINTS]
    rows.append(("abstention rate (below the data minimum)", f"{100 * p['abstention_rate']:.1f} %",
                 f"{100 * p['abstention_rate']:.1f} %"))
    out = [f"Pooled over five held-out folds of hospitals: {p['scored']} scored stays "
           f"({p['deaths']} deaths) of {p['stays']}.", "",
           "| figure | shipped | recalibrated |", "|---|---|---|"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    out += ["", "| fold | hospitals | stays (scored, deaths) | site map | points (risk ≥) | "
            "withheld | site coverage (deaths) |", "|---|---:|---|---|---|---|---|"]
    for f in res["folds"]:
        pts = ", ".join(f"{k} {v:.3f}" for k, v in f["points"].items())
        out.append(f"| {f['fold']} | {f['hospitals']} | {f['stays']} ({f['scored']}, "
                   f"{f['deaths']}) | {f['calibration']} | {pts} | "
                   f"{', '.join(f['withheld']) or '—'} | {100 * f['coverage']:.1f} % "
                   f"({100 * f['coverage_deaths']:.1f} %) |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", type=Path, help="the eICU demo converted with --feature-set "
                    "physionet2012-full")
    ap.add_argument("--model", type=Path, default=Path("models/mortality/1.3.2"))
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    res = run(args.model, args.data, args.folds, args.seed, args.n_boot)
    res["targets"] = targets(res)
    if args.out:
        args.out.write_text(json.dumps(res, indent=2) + "\n")
    print()
    print(markdown(res))
    print()
    for line in res["targets"]:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
