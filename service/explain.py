"""Explanations: what each `explain` level asks for, and the assets that explain a stay's
risk from a model's outputs (anchors, margin percentiles, prototypes with their outcome
rate's Wilson interval).

Everything here is numpy over the whole batch at once and uses only manifest data, so the
explanation of a stay is the same whichever batch it was computed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from scehr.schemas.manifest import Manifest

Explain = Literal["basic", "top", "full"]
#: Every interface's default explanation: the nearest-anchor read-outs and prototypes, which
#: come with the stay's own model row. Contributions (`top`, `full`) are asked for: each costs
#: one more model row per observed channel (docs/service.md, "What contributions cost").
DEFAULT_EXPLAIN: Explain = "basic"
#: Contributions shown per class at `explain=top`; `explain=full` lists every observed channel.
TOP_CONTRIBUTIONS = 3


@dataclass(frozen=True)
class Level:
    """What an `explain` level asks for: occlusion rows (one more model row per observed
    channel of the stay, from which contributions are read) and how many contributions each
    class lists (None: every observed channel)."""

    occlusion: bool
    contributions: int | None
    #: occlude only the channels the model's explanation screen picks, when it has one
    #: (`scehr.schemas.explanation_screen`); else every observed channel (exact occlusion)
    screened: bool = False

    @property
    def every_channel(self) -> bool:
        """Every channel's contribution of every class in the answer: its size (and the CPU
        to build it) grows with channels x classes."""
        return self.occlusion and self.contributions is None


#: The one reading of `explain`: everything else asks its level.
#: `top` is screened where the model carries a screen; `full` is always exact occlusion.
LEVELS: dict[str, Level] = {"basic": Level(False, 0),
                            "top": Level(True, TOP_CONTRIBUTIONS, screened=True),
                            "full": Level(True, None)}

_EPS = 1e-12


def _unit_rows(a: np.ndarray) -> np.ndarray:
    return a / np.maximum(np.sqrt((a * a).sum(axis=-1, keepdims=True)), _EPS)


def _row_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a [n, D] · b [k, D] -> [n, k], each row on its own (BLAS matmul would round a row
    differently depending on how many rows share the call, i.e. on the batch)."""
    return (a[:, None, :] * b[None, :, :]).sum(axis=-1)


def wilson_interval(successes: np.ndarray, n: np.ndarray, z: float = 1.959964
                    ) -> tuple[np.ndarray, np.ndarray]:
    """95% Wilson score interval of a proportion (sound near 0 and 1, unlike the Wald one)."""
    k = np.asarray(successes, dtype=np.float64)
    m = np.maximum(np.asarray(n, dtype=np.float64), 1.0)
    p = k / m
    centre = (p + z * z / (2 * m)) / (1 + z * z / m)
    half = z * np.sqrt(p * (1 - p) / m + z * z / (4 * m * m)) / (1 + z * z / m)
    return np.clip(centre - half, 0.0, 1.0), np.clip(centre + half, 0.0, 1.0)


@dataclass
class Prototypes:
    """One class's prototype centroids (unit length) with their counts and outcome rates."""

    unit: np.ndarray  # [P, D]
    label: np.ndarray  # [P]
    count: np.ndarray  # [P]
    outcome_rate: np.ndarray  # [P]
    ci_low: np.ndarray  # [P]
    ci_high: np.ndarray  # [P]
    names: list[str]

    @classmethod
    def of(cls, centroids: list[list[float]], label: list[int], count: list[int],
           rate: list[float]) -> Prototypes:
        n = np.asarray(count)
        r = np.asarray(rate, dtype=np.float64)
        lo, hi = wilson_interval(np.round(r * n), n)
        names = [f"outcome rate {a:.1%} [{b:.1%}, {c:.1%}] among {k} training stays"
                 for a, b, c, k in zip(r.tolist(), lo.tolist(), hi.tolist(), n.tolist(),
                                       strict=True)]
        return cls(_unit_rows(np.asarray(centroids, dtype=np.float64)), np.asarray(label), n,
                   r, lo, hi, names)


@dataclass
class MarginPercentiles:
    """One class's margin quantiles among held-out stays without / with the outcome."""

    levels: np.ndarray
    without: np.ndarray | None
    with_: np.ndarray | None

    def percentile(self, margin: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Percent of each group below `margin` (1 to 99: the extremes are not stored)."""
        def one(q: np.ndarray | None) -> np.ndarray | None:
            return None if q is None else np.interp(margin, q, self.levels)
        return one(self.without), one(self.with_)


@dataclass
class ExplainAssets:
    """Per-class serving assets of one model, as arrays."""

    labels: list[str]
    u_unit: np.ndarray  # [C, D]
    v_unit: np.ndarray  # [C, D]
    u: np.ndarray
    v: np.ndarray
    prototypes: list[Prototypes | None]
    margins: list[MarginPercentiles | None]

    @classmethod
    def from_manifest(cls, m: Manifest) -> ExplainAssets:
        u = np.asarray(m.anchors["u"], dtype=np.float64)
        v = np.asarray(m.anchors["v"], dtype=np.float64)
        protos: list[Prototypes | None] = []
        for card in m.classes:
            if not card.prototypes:
                protos.append(None)
                continue
            protos.append(Prototypes.of(
                [p.centroid for p in card.prototypes], [p.label for p in card.prototypes],
                [p.count for p in card.prototypes], [p.outcome_rate for p in card.prototypes]))
        margins: list[MarginPercentiles | None] = []
        for card in m.classes:
            ref = card.margin_reference
            usable = ref is not None and (ref.without_outcome or ref.with_outcome)
            margins.append(None if not usable else MarginPercentiles(
                np.asarray(ref.percentiles),
                None if ref.without_outcome is None else np.asarray(ref.without_outcome),
                None if ref.with_outcome is None else np.asarray(ref.with_outcome)))
        return cls(
            labels=list(m.label_names), u_unit=_unit_rows(u), v_unit=_unit_rows(v), u=u, v=v,
            prototypes=protos, margins=margins,
        )

    def anchor_cosines(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos(z, u_c) and cos(z, v_c), each [n, C]."""
        zu = _unit_rows(z)
        return _row_dot(zu, self.u_unit), _row_dot(zu, self.v_unit)

    def nearest_prototypes(self, z: np.ndarray, k: int = 1
                           ) -> list[tuple[np.ndarray, np.ndarray] | None]:
        """Per class: (indices of the k nearest prototypes by cosine [n, k], cosines [n, k])."""
        if self._proto_unit is None:  # no class has prototypes
            return [None] * len(self.prototypes)
        # One product against every class's prototypes at once (stacked at load), laid out
        # [n, C, most prototypes] with -inf after a class's own, then one stable argsort for
        # all classes: the same order per class as sorting each class's slice on its own.
        cos_all = _row_dot(_unit_rows(z), self._proto_unit)  # [n, all prototypes]
        if len(self.prototypes) == 1:  # one class (mortality): its prototypes are the grid
            idx1 = np.argsort(-cos_all, axis=1, kind="stable")[:, :k]  # [n, k]
            near1 = cos_all[np.arange(len(z))[:, None], idx1]
            return [(idx1, near1)]
        grid = np.full((len(z), *self._proto_slots.shape), -np.inf)
        rows, slots = self._proto_filled
        grid[:, rows, slots] = cos_all
        idx = np.argsort(-grid, axis=2, kind="stable")[:, :, :k]  # [n, C, k]
        near = np.take_along_axis(grid, idx, axis=2)
        return [None if p is None else (idx[:, c, : min(k, len(p.unit))],
                                        near[:, c, : min(k, len(p.unit))])
                for c, p in enumerate(self.prototypes)]

    def __post_init__(self) -> None:
        units = [p.unit for p in self.prototypes if p is not None]
        self._proto_unit = np.ascontiguousarray(np.concatenate(units)) if units else None
        sizes = [0 if p is None else len(p.unit) for p in self.prototypes]
        # slot (class, j) of the grid holds class c's j-th prototype where j < its count
        self._proto_slots = np.zeros((len(sizes), max(sizes, default=0)), dtype=bool)
        for c, n in enumerate(sizes):
            self._proto_slots[c, :n] = True
        self._proto_filled = self._proto_slots.nonzero()
