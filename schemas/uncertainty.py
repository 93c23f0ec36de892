"""The uncertainty a model serves next to each risk, as data the service reads with numpy only.

Two read-outs of the served risk r, both fitted on the export's held-out calibration split
(`scehr.training.uncertainty`) and both monotone step functions of r:

- the inductive Venn-Abers pair [low, high] (p0, p1): the isotonic calibration of r refitted
  with the stay itself added once as "no outcome" and once as "outcome". Under
  exchangeability one of the two is a perfectly calibrated probability; their distance is
  wide where the held-out stays near r are few or mixed.
- the class-conditional (Mondrian) split-conformal outcome set at `level`: "outcome" is in
  the set when r >= `event_from`, "no outcome" when r <= `no_event_up_to`. For a new stay
  exchangeable with the held-out ones, P(true outcome in the set | outcome) >= level, and the
  same given no outcome: coverage is measurable on any labelled set.

docs/method.md ("Uncertainty") defines both guarantees and what empirical coverage means.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

#: An interval at least this wide (high - low, on the risk scale) is called wide in the CDS
#: card: the held-out stays near this risk are few or disagree.
WIDE_INTERVAL = 0.10

#: The outcome-set levels export chooses among on validation, highest first.
LEVELS = (0.95, 0.9, 0.8)


class CoverageCheck(BaseModel):
    """Empirical coverage of the outcome sets on one labelled split."""

    model_config = ConfigDict(extra="forbid")

    split: str = Field(description="Where it was measured (e.g. the validation split)")
    n: int
    positives: int
    coverage: float = Field(description="Share of stays whose true outcome is in their set")
    coverage_with_outcome: float | None = Field(
        description="The same among stays with the outcome (None: none)")
    coverage_without_outcome: float | None = Field(
        description="The same among stays without it (None: none)")
    single_outcome: float = Field(description="Share of stays given a one-outcome set")
    mean_width: float = Field(description="Mean Venn-Abers width high - low")


class RiskUncertainty(BaseModel):
    """Per class (contract 1.4): the Venn-Abers pair and the conformal outcome set of a risk."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["venn-abers+mondrian-conformal"] = "venn-abers+mondrian-conformal"
    input: Literal["risk"] = Field("risk", description="Both read the served (calibrated) risk")
    cuts: list[float] = Field(description="Ascending risks where the pair changes; segment k "
                              "is [cuts[k-1], cuts[k]), segment 0 below cuts[0]")
    low: list[float] = Field(description="p0 per segment (len(cuts) + 1)")
    high: list[float] = Field(description="p1 per segment (len(cuts) + 1)")
    level: float = Field(gt=0.0, lt=1.0, description="Nominal coverage of the outcome set")
    event_from: float = Field(description="The outcome is in the set when risk >= this "
                              "(0: always)")
    no_event_up_to: float = Field(description="No outcome is in the set when risk <= this "
                                  "(1: always)")
    fitted_on: str = Field(description="The held-out stays both were fitted on")
    n: int = Field(description="Held-out stays fitted on")
    positives: int = Field(description="Of which with the outcome")
    validation: CoverageCheck | None = Field(
        None, description="Coverage at `level` on the validation split, which chose it")
    test: CoverageCheck | None = Field(
        None, description="Coverage on the test split (reported only; it chose nothing)")

    _arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _shapes(self) -> RiskUncertainty:
        if len(self.low) != len(self.cuts) + 1 or len(self.high) != len(self.cuts) + 1:
            raise ValueError(f"uncertainty: low and high need len(cuts) + 1 = "
                             f"{len(self.cuts) + 1} values, got {len(self.low)} and "
                             f"{len(self.high)}")
        if any(b <= a for a, b in zip(self.cuts, self.cuts[1:], strict=False)):
            raise ValueError("uncertainty: cuts must be strictly ascending")
        if any(lo > hi for lo, hi in zip(self.low, self.high, strict=True)):
            raise ValueError("uncertainty: low must not exceed high in any segment")
        return self

    def interval(self, risk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(low, high) of each risk: the Venn-Abers pair of its segment."""
        if self._arrays is None:
            self._arrays = (np.asarray(self.cuts, dtype=np.float64),
                            np.asarray(self.low, dtype=np.float64),
                            np.asarray(self.high, dtype=np.float64))
        cuts, low, high = self._arrays
        k = np.searchsorted(cuts, np.asarray(risk, dtype=np.float64), side="right")
        return low[k], high[k]

    def served_interval(self, risk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(low, high) as served: the smallest interval holding both the risk and its
        Venn-Abers pair. The pair comes from an isotonic fit, the risk from the calibration
        map, so the pair can sit beside the risk; an interval beside the number it qualifies
        reads as a contradiction. The hull still holds the pair (so a calibrated probability,
        under exchangeability) and widens exactly by how far the two calibrations disagree."""
        r = np.asarray(risk, dtype=np.float64)
        low, high = self.interval(r)
        return np.minimum(low, r), np.maximum(high, r)

    def outcome_set(self, risk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(outcome in the set, no outcome in the set) of each risk, at `level`."""
        r = np.asarray(risk, dtype=np.float64)
        return r >= self.event_from, r <= self.no_event_up_to

    def covered(self, y: np.ndarray, risk: np.ndarray) -> np.ndarray:
        """Whether each stay's true outcome `y` (0/1) is in its set."""
        event, no_event = self.outcome_set(risk)
        return np.where(np.asarray(y) > 0.5, event, no_event)
