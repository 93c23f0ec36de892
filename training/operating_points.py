"""Operating points a clinician can defend: chosen on validation, or withheld with the reason.

`scehr.training.calibration.choose_named_points` finds each rule's threshold on the validation risk.
This module keeps only the points validation can support:

- a class with fewer than `MIN_POSITIVES` validation stays with the outcome gets no point (a
  sensitivity or PPV on a handful of stays is noise);
- a threshold at the risk floor or ceiling (`RISK_EPS`) or at or below the lowest validation
  risk alerts for everyone (or no one): withheld;
- a point that alerts more than `MAX_ALERT_RATE` of validation stays is no alert: withheld;
- a rule that validation cannot meet (e.g. PPV 0.5 for a rare label) is withheld, never
  approximated.

Each withheld point keeps its reason (in the manifest, the response and the model card). The
points are ordered (thresholds and PPV rise from high_sensitivity through balanced to
high_ppv), and the levels a card shows are named points too: `warning` at the class's default
point, `critical` at the most specific kept point above it (the highest threshold).
"""

from __future__ import annotations

import numpy as np

from scehr.schemas.contract import RISK_EPS
from scehr.schemas.manifest import ClassCard, NamedOperatingPoint, RiskLevels, WithheldPoint
from scehr.training.model_card import MIN_POSITIVES

#: The point names, in the order a class's default is taken from.
POINT_NAMES = ("high_sensitivity", "balanced", "high_ppv")
#: The largest share of validation stays a served point may alert for.
MAX_ALERT_RATE = 0.5


def why_not(p: NamedOperatingPoint, lowest_risk: float | None = None,
            on: str = "validation") -> str | None:
    """Why validation cannot support point `p` (None: it can). `lowest_risk`, the lowest
    validation risk, when known (else an alert rate of 1 stands for it); `on`: the
    adjective the reason gives the stays that chose the point ("validation")."""
    t = p.threshold
    if t <= RISK_EPS * (1 + 1e-9) or t >= 1.0 - RISK_EPS * (1 + 1e-9):
        return (f"its threshold {t:.4g} is at the risk {'floor' if t < 0.5 else 'ceiling'}: "
                "it would alert for every stay or for none")
    if (lowest_risk is not None and t <= lowest_risk) or p.validation.alert_rate >= 1.0:
        return f"its threshold {t:.4g} is at or below every {on} risk: it alerts for all"
    rate = p.validation.alert_rate
    if rate > MAX_ALERT_RATE:
        return (f"it would alert for {rate:.0%} of {on} stays (more than "
                f"{MAX_ALERT_RATE:.0%}): not an alert")
    return None


def defensible_points(val: tuple[np.ndarray, np.ndarray],
                      test: tuple[np.ndarray, np.ndarray] | None
                      ) -> tuple[list[NamedOperatingPoint], list[WithheldPoint]]:
    """(points kept, points withheld with the reason) of one class, from (y, risk)."""
    from scehr.training.calibration import named_point_rules
    from scehr.training.export import named_points

    y = np.asarray(val[0]).ravel().astype(int)
    risk = np.asarray(val[1], dtype=np.float64).ravel()
    pos = int(y.sum())
    return screen(named_points((y, risk), test), pos, float(risk.min()),
                  unmet=named_point_rules(y, risk)[1])


def screen(points: list[NamedOperatingPoint], positives: int, lowest_risk: float | None = None,
           unmet: dict[str, str] | None = None, on: str = "validation"
           ) -> tuple[list[NamedOperatingPoint], list[WithheldPoint]]:
    """(kept, withheld) of points already chosen on validation, from their stored figures;
    `unmet`: why each missing point's rule was not met, when known; `on`: the adjective the
    reasons give the stays that chose them ("validation")."""
    if positives < MIN_POSITIVES:
        why = (f"{positives} {on} stay(s) with the outcome; at least {MIN_POSITIVES} are "
               "needed to choose an alert threshold")
        return [], [WithheldPoint(name=n, reason=why) for n in POINT_NAMES]
    kept, withheld = [], []
    found = {p.name: p for p in points}
    for name in POINT_NAMES:
        p = found.get(name)
        if p is None:
            why = (unmet or {}).get(name, f"its rule cannot be met on the {on} stays")
            withheld.append(WithheldPoint(name=name, reason=why))
            continue
        why = why_not(p, lowest_risk, on)
        if why is None:
            kept.append(p)
        else:
            withheld.append(WithheldPoint(name=name, reason=why))
    return kept, withheld


def default_point(kept: list[NamedOperatingPoint], previous: str | None) -> str | None:
    """The previous default when it is kept, else the first kept point in POINT_NAMES order."""
    names = [p.name for p in kept]
    if previous in names:
        return previous
    return next((n for n in POINT_NAMES if n in names), None)


def risk_levels(kept: list[NamedOperatingPoint], default: str | None) -> RiskLevels | None:
    """warning at the default point; critical at the most specific kept point above it, the
    one with the highest threshold (None when there is none): with ordered points, high_ppv
    when it is kept, so "critical" fires for the fewest patients."""
    by_name = {p.name: p for p in kept}
    if default not in by_name:
        return None
    base = by_name[default].threshold
    above = sorted((p for p in kept if p.threshold > base + 1e-12), key=lambda p: p.threshold)
    return RiskLevels(warning=default, critical=above[-1].name if above else None)


def with_points(card: ClassCard, kept: list[NamedOperatingPoint],
                withheld: list[WithheldPoint]) -> ClassCard:
    """`card` serving the `kept` points: its default (the previous one when kept) and its
    levels follow from them, so levels never name a point that is not served."""
    default = default_point(kept, card.default_operating_point)
    return card.model_copy(update={"named_points": kept, "withheld_points": withheld,
                                   "default_operating_point": default,
                                   "levels": risk_levels(kept, default)})
