"""Operating points of a loaded model, and the one a request chooses.

A contract >= 1.1 manifest stores named points per class as thresholds on the risk. A
contract 1.0 manifest stores one default threshold on the model's probability (`score`); when
its calibration map is a non-decreasing function of that probability alone (no map, isotonic,
temperature on the probability), `score >= t` and `risk >= cal(t)` raise the same alerts (up to
ties on a step map's flat pieces), so the point is served on the risk. A temperature map on the
margin is not a function of the score, so such a point stays on the score, and each result
says so (`applies_to`). Points a 1.0 manifest lacks (balanced, high_ppv) are not invented.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from scehr.schemas.manifest import Manifest

CUSTOM = "custom"
LEGACY_RULE = "sensitivity>=0.8"


@dataclass(frozen=True)
class Choice:
    """Thresholds for one request: per class, with the name each class really used."""

    name: str
    thresholds: np.ndarray  # [C]
    on_score: np.ndarray  # [C] bool
    used: list[str]  # [C] point name per class (differs from `name` on a fallback)
    source: str  # default | request
    #: [C] why a class raises no alert at this point (withheld on validation), else None
    withheld: tuple[str | None, ...] = ()
    #: score a stay below the model's data minimum anyway (research use)
    allow_insufficient: bool = False

    def reason(self, c: int) -> str | None:
        return self.withheld[c] if self.withheld else None


@dataclass(frozen=True)
class PointTable:
    names: tuple[str, ...]
    thresholds: np.ndarray  # [P, C], NaN where a class lacks the point
    on_score: np.ndarray  # [P, C] bool
    validation_alert_rate: np.ndarray  # [P, C], NaN where unknown
    default: np.ndarray  # [C] index into names
    legacy: bool
    #: per (point name, class): why validation cannot support it (the class gets no alert)
    withheld: dict[tuple[str, int], str] | None = None

    @classmethod
    def from_manifest(cls, m: Manifest) -> PointTable:
        if any(c.named_points for c in m.classes):
            return cls._named(m)
        return cls._legacy(m)

    @classmethod
    def _named(cls, m: Manifest) -> PointTable:
        names = tuple(dict.fromkeys([*(p.name for c in m.classes for p in c.named_points),
                                     *(w.name for c in m.classes for w in c.withheld_points)]))
        withheld = {(w.name, c): w.reason for c, card in enumerate(m.classes)
                    for w in card.withheld_points}
        shape = (len(names), len(m.classes))
        thr = np.full(shape, np.nan)
        rate = np.full(shape, np.nan)
        default = np.zeros(len(m.classes), dtype=np.int64)
        for c, card in enumerate(m.classes):
            for p in card.named_points:
                k = names.index(p.name)
                thr[k, c], rate[k, c] = p.threshold, p.validation.alert_rate
            if card.default_operating_point in names:
                default[c] = names.index(card.default_operating_point)
            else:  # first point this class has
                have = np.flatnonzero(~np.isnan(thr[:, c]))
                default[c] = have[0] if have.size else 0
        missing = np.isnan(thr[default, np.arange(len(m.classes))])
        for c in np.flatnonzero(missing):  # a class no rule could serve
            if not any(k[1] == c for k in withheld):  # older manifests: 0.5 on the risk
                thr[default[c], c] = 0.5
        return cls(names, thr, np.zeros(shape, dtype=bool), rate, default, legacy=False,
                   withheld=withheld)

    def _why(self, name: str, c: int) -> str | None:
        """Why class `c` has no point `name` (None: it has it, or it falls back)."""
        if not self.withheld:
            return None
        if (name, c) in self.withheld:
            return self.withheld[(name, c)]
        if np.isnan(self.thresholds[:, c]).all():
            return next((v for (n, k), v in self.withheld.items() if k == c), None)
        return None

    @classmethod
    def _legacy(cls, m: Manifest) -> PointTable:
        c_n = len(m.classes)
        thr, on_score, rate = np.zeros((1, c_n)), np.zeros((1, c_n), dtype=bool), np.zeros((1, c_n))
        for c, card in enumerate(m.classes):
            t = card.default_threshold
            row = next((o for o in card.operating_points if abs(o.threshold - t) < 1e-12), None)
            rate[0, c] = row.alert_rate if row is not None else np.nan
            cal = card.calibration
            if cal.monotone_in_probability:
                thr[0, c] = float(cal.apply(np.array([t]), np.array([0.0]))[0])
            else:
                thr[0, c], on_score[0, c] = t, True
        return cls(("high_sensitivity",), thr, on_score, rate, np.zeros(c_n, dtype=np.int64),
                   legacy=True)

    def default_choice(self) -> Choice:
        return self._default_choice

    @cached_property
    def _default_choice(self) -> Choice:
        """Built once per model, not per request; its arrays are read-only, as every request
        shares them."""
        cols = np.arange(self.thresholds.shape[1])
        thr = self.thresholds[self.default, cols]
        on_score = self.on_score[self.default, cols]
        thr.setflags(write=False)
        on_score.setflags(write=False)
        used = [self.names[int(k)] if not np.isnan(thr[c]) else "none"
                for c, k in enumerate(self.default)]
        why = tuple(self._why(self.names[int(k)], c) if np.isnan(thr[c]) else None
                    for c, k in enumerate(self.default))
        return Choice(self.names[int(self.default[0])], thr, on_score, used, "default",
                      why if any(why) else ())

    def choose(self, name: str | None, threshold: float | None) -> Choice:
        """The request's point (validated by the caller against `names`)."""
        c_n = self.thresholds.shape[1]
        if threshold is not None:
            return Choice(CUSTOM, np.full(c_n, float(threshold)), np.zeros(c_n, dtype=bool),
                          [CUSTOM] * c_n, "request")
        base = self.default_choice()
        if name is None:
            return base
        k = self.names.index(name)
        why = tuple(self._why(name, c) for c in range(c_n))
        # a point withheld for a class: no alert there (NaN), never another point's alert
        have = ~np.isnan(self.thresholds[k]) | np.array([w is not None for w in why])
        thr = np.where(have, self.thresholds[k], base.thresholds)
        on_score = np.where(have, self.on_score[k], base.on_score)
        used = [name if h else u for h, u in zip(have.tolist(), base.used, strict=True)]
        return Choice(name, thr, on_score, used, "request", why if any(why) else ())

    @cached_property
    def _alert_bounds(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """[1, C, P] each: where the point exists, its threshold (+inf where not), and whether
        it applies to the score: `alerts_of_every_point` runs on every scored request."""
        thr = self.thresholds.T[None]
        return ~np.isnan(thr), np.nan_to_num(thr, nan=np.inf), self.on_score.T[None]

    def alerts_of_every_point(self, risk: np.ndarray, score: np.ndarray) -> np.ndarray:
        """[n, C, P] alert of every named point (False where a class lacks it), which drift
        monitoring counts; a response's alerts are those of the request's one chosen point."""
        exists, bound, on_score = self._alert_bounds
        value = np.where(on_score, score[:, :, None], risk[:, :, None])
        return exists & (value >= bound)
