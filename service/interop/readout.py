"""The one place the interfaces read a class result: risk, alert, level and words.

Every interface (FHIR RiskAssessment, CDS Hooks cards, Open Inference outputs) reads a
`ClassResult` only through these functions, so a change of the response contract (e.g. the
calibrated probability renamed `risk`) is a one-line change here.
"""

from __future__ import annotations

from typing import Literal

from scehr.schemas.manifest import Manifest
from scehr.schemas.payloads import ClassResult, RiskInterval

Level = Literal["info", "warning", "critical"]


def risk_of(r: ClassResult) -> float:
    """The calibrated risk (what a clinician reads)."""
    return r.risk


def interval_of(r: ClassResult) -> RiskInterval | None:
    """The risk's uncertainty (None: the model serves none)."""
    return r.risk_interval


_OUTCOME_WORDS = {("outcome",): "the outcome only", ("no_outcome",): "no outcome only",
                  ("outcome", "no_outcome"): "either outcome (it cannot tell them apart)",
                  (): "neither outcome (unlike the held-out stays of both)"}


def uncertainty_words(r: ClassResult) -> str:
    """The interval in words; a wide one said plainly (it is information, not a failure)."""
    return interval_words(interval_of(r))


def interval_words(ri: RiskInterval | None) -> str:
    """`uncertainty_words` of a risk's interval (None: the model serves none)."""
    if ri is None:
        return "This model version serves no uncertainty interval."
    words = f"Uncertainty: the risk lies between {ri.low:.1%} and {ri.high:.1%} (Venn-Abers)"
    if ri.wide:
        words += (": a wide interval, because few held-out stays had a risk like this one or "
                  "their outcomes disagreed; read the risk as less certain than its number")
    return words + (f". At the {ri.level:.0%} level the risk is typical of "
                    f"{_OUTCOME_WORDS[tuple(ri.outcomes)]}.")


def score_of(r: ClassResult) -> float:
    """The model's own read-out (not a probability to show)."""
    return r.score


def alert_of(r: ClassResult) -> bool:
    """At or above the request's operating point (the model's default unless it names one)."""
    return r.alert


def level_thresholds(manifest: Manifest, label: str) -> tuple[float | None, float | None]:
    """(warning, critical) thresholds on the risk of a class: the named points its manifest
    declares as levels; for manifests before levels, the default named point and the kept
    point with the next higher threshold. (None, None): the class has no named point."""
    card = next((c for c in manifest.classes if c.label == label), None)
    if card is None or not card.named_points:
        return None, None
    by = {p.name: p.threshold for p in card.named_points}
    if card.levels is not None:
        crit = card.levels.critical
        return by.get(card.levels.warning), by.get(crit) if crit else None
    warn = by.get(card.default_operating_point or "", card.named_points[0].threshold)
    above = sorted(t for t in by.values() if t > warn + 1e-12)
    return warn, above[0] if above else None


def level_of(r: ClassResult, manifest: Manifest) -> Level:
    """On the risk: critical at or above the critical threshold, warning at or above the
    warning one, info below (`level_thresholds`). A contract 1.0 model without named points
    on the risk: warning when it alerts."""
    warn, crit = level_thresholds(manifest, r.label)
    if warn is None and crit is None:
        has_points = any(c.named_points or c.withheld_points for c in manifest.classes)
        return "warning" if alert_of(r) and not has_points else "info"
    risk = risk_of(r)
    if crit is not None and risk >= crit:
        return "critical"
    return "warning" if warn is not None and risk >= warn else "info"


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


def _point_words(r: ClassResult) -> str:
    op = r.operating_point
    if op.withheld is not None or op.threshold is None:
        return f"no alert for this outcome ({op.withheld or 'no operating point'})"
    where = "at or above" if r.alert else "below"
    what = "a requested threshold" if op.name == "custom" else f"the {op.name} operating point"
    return f"{where} {what} (alert when the risk is {op.threshold:.1%} or more)"


def rationale(r: ClassResult, manifest: Manifest) -> str:
    """The explanation in words (no patient values: only the model's read-outs)."""
    level = level_of(r, manifest)
    warn, crit = level_thresholds(manifest, r.label)
    cuts = [f"{name} from a risk of {t:.1%}" for name, t in (("warning", warn),
                                                            ("critical", crit)) if t is not None]
    words = [f"Risk {risk_of(r):.1%}: {_point_words(r)}. Level {level}"
             + (f" ({'; '.join(cuts)})." if cuts else ".")]
    words.append(uncertainty_words(r))
    e = r.explanation
    words.append(f"The stay's embedding is nearer the {e.nearer_anchor} anchor "
                 f"(margin {e.margin:+.2f}).")
    if r.prototypes:
        p = r.prototypes[0]
        words.append(f"Nearest group of training stays: {p.count} stays with an observed "
                     f"outcome rate of {p.outcome_rate:.0%} [{p.ci_low:.0%}, {p.ci_high:.0%}].")
    top = top_contributions(r)
    if top:
        words.append("Variables raising the risk most: " + ", ".join(
            f"{v} (+{d * 100:.1f} points)" for v, d in top) + ".")
    return " ".join(words)
