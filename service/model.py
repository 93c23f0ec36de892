"""A served model as data: its spec from the manifest (feature set, normalizer, operating
points, explanation assets, calibration maps) and the read-outs of its outputs.

Built once per loaded model (`ModelSpec.from_manifest`, by the registry), then read by every
request: the per-request path (`scehr.service.pipeline`, `scehr.service.responses`) only reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from scehr.schemas.audit import feature_set_hash
from scehr.schemas.featureset import FeatureSet
from scehr.schemas.manifest import Calibration, Manifest
from scehr.schemas.payloads import ModelRef
from scehr.schemas.profile import Bins
from scehr.schemas.tensorize import Normalizer, StaticImputer
from scehr.service.batcher import ModelOutputs
from scehr.service.explain import ExplainAssets
from scehr.service.operating import PointTable


@dataclass
class ModelSpec:
    """Everything about a model the pipeline needs, from its manifest (no ORT session)."""

    task: str
    manifest: Manifest
    ref: ModelRef
    fs: FeatureSet
    normalizer: Normalizer
    static: StaticImputer | None
    assets: ExplainAssets
    neutralised: np.ndarray  # channel indices never observed in training
    points: PointTable
    fs_hash: str
    bins: Bins | None  # value bins of the monitoring reference (None: contract 1.0)
    fixed_t: int | None = None

    @classmethod
    def from_manifest(cls, m: Manifest, sha256: str, fixed_t: int | None = None) -> ModelSpec:
        fs = FeatureSet.from_dict(m.feature_set)
        static = None
        if m.encoder.uses_static:
            if m.static is None:
                raise ValueError("encoder.uses_static is true but the manifest has no `static`")
            static = StaticImputer.from_dict(m.static)
        neutral = [i for i, v in enumerate(fs.variable_ids) if m.coverage.get(v, 1.0) <= 0.0]
        fs_hash = feature_set_hash(m.feature_set)
        ref = ModelRef(task=m.task, name=m.name, version=m.version, sha256=sha256,
                       feature_set=fs.name, feature_set_hash=fs_hash, loss=m.loss.name)
        bins = None
        if m.value_reference:
            bins = Bins.of(fs, {k: h.edges for k, h in m.value_reference.items() if h.edges})
        return cls(m.task, m, ref, fs, Normalizer.from_dict(m.normalizer), static,
                   ExplainAssets.from_manifest(m), np.asarray(neutral, dtype=np.int64),
                   PointTable.from_manifest(m), fs_hash, bins, fixed_t)

    @cached_property
    def screen(self) -> tuple[np.ndarray, int] | None:
        """The explanation screen's coefficients [channels, features] and its number of
        candidates, when the manifest carries one (contract 1.6)."""
        sc = self.manifest.explanation_screen
        return None if sc is None else (np.asarray(sc.coefficients, dtype=np.float64),
                                        sc.candidates)

    @cached_property
    def calibrations(self) -> list[Calibration]:
        """Per class, the map from the model's probability (or margin) to the risk."""
        return [c.calibration for c in self.manifest.classes]


@dataclass
class ReadOuts:
    """The read-outs of every row (stays, then their occlusion variants), [rows, C] each:
    the model's probability (the graph's output, reported as a result's `score`), the
    margin u^T z - v^T z, and the risk (the calibrated probability)."""

    probability: np.ndarray
    margin: np.ndarray
    risk: np.ndarray


def calibrate(spec: ModelSpec, p: np.ndarray, margin: np.ndarray) -> np.ndarray:
    """[n, C] risks: each class's calibration map applied to its probability or margin."""
    out = np.empty_like(p)
    for c, cal in enumerate(spec.calibrations):
        out[:, c] = cal.apply(p[:, c], margin[:, c])
    return out


def read_out(spec: ModelSpec, out: ModelOutputs) -> ReadOuts:
    al = out.anchor_logits.astype(np.float64)
    p = out.probability.astype(np.float64)
    margin = al[..., 0] - al[..., 1]
    return ReadOuts(p, margin, calibrate(spec, p, margin))
