"""The one place the interfaces read a class result: risk, alert, level and words.

Every interface (FHIR RiskAssessment, CDS Hooks cards, Open Inference outputs) reads a
`ClassResult` only through these functions, so a change of the response contract (e.g. the
calibrated probability renamed `risk`) is a one-line change here.
"""

from __future__ import annotations

from typing import Literal

from schemas.manifest import Manifest
from schemas.payloads import ClassResult

Level = Literal["info", "warning", "critical"]


def risk_of(r: ClassResult) -> float:
    """The calibrated risk (what a clinician reads)."""
    return r.calibrated_probability


def score_of(r: ClassResult) -> float:
    """The model's own probability: operating points are chosen on it."""
    return r.probability


def alert_of(r: ClassResult) -> bool:
    """At or above the model's default operating point."""
    return r.alert


def critical_threshold(manifest: Manifest, label: str) -> float | None:
    """The strictest named operating point of a class that still keeps sensitivity >= 0.5
    and lies above the default one: crossing it is `critical`. None when there is none."""
    for card in manifest.classes:
        if card.label != label:
            continue
        above = [op.threshold for op in card.operating_points
                 if op.sensitivity >= 0.5 and op.threshold > card.default_threshold]
        return max(above) if above else None
    return None


def level_of(r: ClassResult, manifest: Manifest) -> Level:
    """info below the default operating point, warning at or above it, critical at or above
    the stricter operating point of `critical_threshold`."""
    if not alert_of(r):
        return "info"
    crit = critical_threshold(manifest, r.label)
    return "critical" if crit is not None and score_of(r) >= crit else "warning"


#: FHIR qualitativeRisk (http://terminology.hl7.org/CodeSystem/risk-probability) per level.
QUALITATIVE: dict[Level, tuple[str, str]] = {
    "info": ("low", "Low likelihood"),
    "warning": ("moderate", "Moderate likelihood"),
    "critical": ("high", "High likelihood"),
}


def top_contributions(r: ClassResult, k: int = 3) -> list[tuple[str, float]]:
    """The k variables whose values raise the risk most (occlusion, explain=full only)."""
    if not r.contributions:
        return []
    ups = [c for c in r.contributions if c.delta > 0]
    return [(c.variable, c.delta) for c in sorted(ups, key=lambda c: -c.delta)[:k]]


def rationale(r: ClassResult, manifest: Manifest) -> str:
    """The explanation in words (no patient values: only the model's read-outs)."""
    level = level_of(r, manifest)
    e = r.explanation
    words = [f"Risk {risk_of(r):.1%} ({level}: model score {score_of(r):.3f} against the "
             f"default operating point {r.threshold:.3f})."]
    words.append(f"The stay's embedding is nearer the {e.nearer_anchor} anchor "
                 f"(margin {e.margin:+.2f}).")
    if r.prototype is not None:
        p = r.prototype
        words.append(f"Nearest training prototype: {p.count} stays "
                     f"{'with' if p.label else 'without'} the outcome, observed outcome rate "
                     f"{p.outcome_rate:.0%}.")
    top = top_contributions(r)
    if top:
        words.append("Variables raising the risk most: " + ", ".join(
            f"{v} (+{d * 100:.1f} points)" for v, d in top) + ".")
    return " ".join(words)
