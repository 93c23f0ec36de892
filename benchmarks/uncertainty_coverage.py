"""Empirical coverage of the served uncertainty (docs/method.md, "Uncertainty"), per dataset.

Each shipped model is run as the service runs it (its ONNX graph, normalizer and calibration map,
`scehr.training.external.ExportedModel`); each stay's conformal outcome set at the model's level is
read from its manifest, and coverage is the share of stays whose true outcome is in their set:
overall and given each outcome (the guarantee is per outcome), with 95% bootstrap CIs over stays.
Also the share of one-outcome sets and the mean Venn-Abers width high - low.

- mortality on PhysioNet 2012 set C (the test split of the converted data: 4,000 stays);
- mortality on the eICU demo, all its stays (an external site, as `scehr evaluate` reads it);
- phenotypes on the eICU demo's test split (its own held-out test; per class and pooled over
  stay x class pairs).

Usage: .venv/bin/python -m benchmarks.uncertainty_coverage [--mortality DIR] [--phenotypes DIR]
           [--set-c DATA] [--eicu DATA] [--n-boot N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import loadavg
from scehr.schemas.model_index import read_index
from scehr.schemas.uncertainty import RiskUncertainty
from scehr.training.data.splits import SplitArrays
from scehr.training.external import ExportedModel
from scehr.training.uncertainty import coverage

REPO = Path(__file__).resolve().parents[1]


def default_model(task: str) -> Path:
    index = read_index(REPO / "models")
    return REPO / "models" / index.entry(task, index.defaults[task]).path


def _ci(hit: np.ndarray, n_boot: int, seed: int = 0) -> list[float]:
    """95% percentile bootstrap CI of the mean of `hit` ([N] or [N, C]: rows resampled)."""
    if len(hit) == 0:
        return [float("nan")] * 2
    rng = np.random.default_rng(seed)
    means = [hit[rng.integers(0, len(hit), len(hit))].mean() for _ in range(n_boot)]
    return [float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))]


def coverage_row(u: RiskUncertainty, y: np.ndarray, risk: np.ndarray, n_boot: int
                 ) -> dict[str, Any]:
    """`scehr.training.uncertainty.coverage` of the stays, with bootstrap CIs of its coverages."""
    yy = y > 0.5
    hit = u.covered(yy, risk).astype(np.float64)
    row: dict[str, Any] = {"level": u.level,
                           **coverage(u, yy, risk, "").model_dump(exclude={"split"}),
                           "coverage_ci": _ci(hit, n_boot)}
    for name, mask in (("with_outcome", yy), ("without_outcome", ~yy)):
        row[f"coverage_{name}_ci"] = _ci(hit[mask], n_boot)
    return row


def scored(model: ExportedModel, data: Path, splits: tuple[str, ...]
           ) -> tuple[np.ndarray, np.ndarray]:
    """(y [N, C], risk [N, C]) of the splits' stays, concatenated."""
    parts: list[SplitArrays] = [model.load(data, s) for s in splits]
    return (np.concatenate([a.y for a in parts]).astype(np.float64),
            np.concatenate([model.risks(a) for a in parts]))


def binary(folder: Path, data: Path, splits: tuple[str, ...], n_boot: int) -> dict[str, Any]:
    model = ExportedModel(folder)
    u = model.manifest.classes[0].uncertainty
    if u is None:
        raise SystemExit(f"{folder} has no uncertainty map (contract < 1.4)")
    y, r = scored(model, data, splits)
    return {"model": f"{model.manifest.task} {model.manifest.version}", "data": str(data),
            "splits": list(splits), **coverage_row(u, y[:, 0], r[:, 0], n_boot)}


def multi_label(folder: Path, data: Path, splits: tuple[str, ...], n_boot: int
                ) -> dict[str, Any]:
    model = ExportedModel(folder, binary_only=False)
    y, r = scored(model, data, splits)
    maps = [c.uncertainty for c in model.manifest.classes]
    if any(u is None for u in maps):
        raise SystemExit(f"{folder} has a class without an uncertainty map")
    per_class = {c.label: coverage_row(u, y[:, k], r[:, k], n_boot)  # type: ignore[arg-type]
                 for k, (c, u) in enumerate(zip(model.manifest.classes, maps, strict=True))}
    hits = np.stack([u.covered(y[:, k] > 0.5, r[:, k])  # type: ignore[union-attr]
                     for k, u in enumerate(maps)], axis=1).astype(np.float64)
    nominal = np.array([u.level for u in maps])  # type: ignore[union-attr]
    gaps = np.array([row["coverage"] for row in per_class.values()]) - nominal
    return {"model": f"{model.manifest.task} {model.manifest.version}", "data": str(data),
            "splits": list(splits), "n": len(y),
            "pooled_coverage": float(hits.mean()), "pooled_coverage_ci": _ci(hits, n_boot),
            "pooled_nominal": float(nominal.mean()),
            "classes_within_2_points": int((np.abs(gaps) <= 0.02).sum()),
            "classes": len(maps), "per_class": per_class}


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.1%}"


def _line(name: str, row: dict[str, Any]) -> str:
    ci = row["coverage_ci"]
    return (f"{name}: level {row['level']:.0%}, {row['n']} stays ({row['positives']} with the "
            f"outcome): coverage {_pct(row['coverage'])} [{_pct(ci[0])}, {_pct(ci[1])}]; with "
            f"outcome {_pct(row['coverage_with_outcome'])}, without "
            f"{_pct(row['coverage_without_outcome'])}; one-outcome sets "
            f"{_pct(row['single_outcome'])}; mean width {row['mean_width']:.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mortality", type=Path, default=None, help="default: the index default")
    ap.add_argument("--phenotypes", type=Path, default=None, help="default: the index default")
    ap.add_argument("--set-c", type=Path, default=REPO / "data" / "physionet2012-full")
    ap.add_argument("--eicu", type=Path, default=REPO / "data" / "eicu-benchmark")
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    mort = args.mortality or default_model("mortality")
    phen = args.phenotypes or default_model("phenotypes")
    out = {
        "mortality_set_c": binary(mort, args.set_c, ("test",), args.n_boot),
        "mortality_eicu_all": binary(mort, args.eicu, ("train", "val", "test"), args.n_boot),
        "phenotypes_eicu_test": multi_label(phen, args.eicu, ("test",), args.n_boot),
    }
    print(_line(f"{out['mortality_set_c']['model']} on set C", out["mortality_set_c"]))
    print(_line(f"{out['mortality_eicu_all']['model']} on the eICU demo (all stays)",
                out["mortality_eicu_all"]))
    p = out["phenotypes_eicu_test"]
    ci = p["pooled_coverage_ci"]
    print(f"{p['model']} on the eICU demo test split ({p['n']} stays): pooled over stay x "
          f"class {_pct(p['pooled_coverage'])} [{_pct(ci[0])}, {_pct(ci[1])}] against a mean "
          f"nominal {_pct(p['pooled_nominal'])}; {p['classes_within_2_points']} of "
          f"{p['classes']} classes within 2 points of their level")
    for label, row in p["per_class"].items():
        print("  " + _line(label, row))
    print(f"load average {loadavg()}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
