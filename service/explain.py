"""Serving-side read-outs from a model's outputs: calibration, anchors, prototypes, occlusion.

Everything here is numpy over the whole batch at once and uses only manifest data, so the
explanation of a stay is the same whichever batch it was computed in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from schemas.manifest import Calibration, Manifest

_EPS = 1e-12


def _unit_rows(a: np.ndarray) -> np.ndarray:
    return a / np.maximum(np.sqrt((a * a).sum(axis=-1, keepdims=True)), _EPS)


def _row_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a [n, D] · b [k, D] -> [n, k], each row on its own (BLAS matmul would round a row
    differently depending on how many rows share the call, i.e. on the batch)."""
    return (a[:, None, :] * b[None, :, :]).sum(axis=-1)


@dataclass
class Prototypes:
    """One class's prototype centroids (unit length) with their counts and outcome rates."""

    unit: np.ndarray  # [P, D]
    label: np.ndarray  # [P]
    count: np.ndarray  # [P]
    outcome_rate: np.ndarray  # [P]


@dataclass
class ExplainAssets:
    """Per-class serving assets of one model, as arrays."""

    labels: list[str]
    u_unit: np.ndarray  # [C, D]
    v_unit: np.ndarray  # [C, D]
    u: np.ndarray
    v: np.ndarray
    thresholds: np.ndarray  # [C]
    calibrations: list[Calibration]
    prototypes: list[Prototypes | None]

    @classmethod
    def from_manifest(cls, m: Manifest) -> ExplainAssets:
        u = np.asarray(m.anchors["u"], dtype=np.float64)
        v = np.asarray(m.anchors["v"], dtype=np.float64)
        protos: list[Prototypes | None] = []
        for card in m.classes:
            if not card.prototypes:
                protos.append(None)
                continue
            protos.append(Prototypes(
                _unit_rows(np.asarray([p.centroid for p in card.prototypes], dtype=np.float64)),
                np.asarray([p.label for p in card.prototypes]),
                np.asarray([p.count for p in card.prototypes]),
                np.asarray([p.outcome_rate for p in card.prototypes], dtype=np.float64),
            ))
        return cls(
            labels=list(m.label_names), u_unit=_unit_rows(u), v_unit=_unit_rows(v), u=u, v=v,
            thresholds=np.asarray([c.default_threshold for c in m.classes], dtype=np.float64),
            calibrations=[c.calibration for c in m.classes], prototypes=protos,
        )

    def calibrate(self, p: np.ndarray, margin: np.ndarray) -> np.ndarray:
        """[n, C] calibrated probabilities."""
        out = np.empty_like(p)
        for c, cal in enumerate(self.calibrations):
            out[:, c] = cal.apply(p[:, c], margin[:, c])
        return out

    def anchor_cosines(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos(z, u_c) and cos(z, v_c), each [n, C]."""
        zu = _unit_rows(z)
        return _row_dot(zu, self.u_unit), _row_dot(zu, self.v_unit)

    def nearest_prototypes(self, z: np.ndarray) -> list[tuple[np.ndarray, np.ndarray] | None]:
        """Per class: (index of the nearest prototype by cosine [n], that cosine [n])."""
        zu = _unit_rows(z)
        out: list[tuple[np.ndarray, np.ndarray] | None] = []
        for p in self.prototypes:
            if p is None:
                out.append(None)
                continue
            cos = _row_dot(zu, p.unit)  # [n, P]
            idx = cos.argmax(axis=1)
            out.append((idx, cos[np.arange(len(idx)), idx]))
        return out
