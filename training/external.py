"""An exported model (ONNX + manifest) scored on any converted dataset: `ExportedModel`.

The stays are read with the model's own feature set and normalised with its manifest, and the
ONNX graph is run with ONNX Runtime, so the figures are those of the exported artifact (the
service's tensors), not of a checkpoint. A channel the model never saw in training is treated
as not observed, as the service does. The site model (`scehr.training.site_model`), the
robustness study and the benchmarks build on it; `scehr evaluate` scores through the service's
own code instead (`scehr.training.site_report`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from scehr.schemas.contract import (
    INPUT_LENGTHS,
    INPUT_STATIC,
    INPUT_X,
    OUTPUT_ANCHOR_LOGITS,
    OUTPUT_PROBABILITY,
)
from scehr.schemas.featureset import FeatureSet
from scehr.schemas.manifest import ClassCard, Manifest, load_manifest
from scehr.schemas.tasks import task_spec
from scehr.schemas.tensorize import Normalizer, Observations, StaticImputer, discretize
from scehr.training import fairness
from scehr.training.data.splits import SplitArrays, load_split

SPLITS = ("train", "val", "test")
BATCH = 256


@dataclass
class Scored:
    """One split scored by the exported model (class 0 of a binary task)."""

    y: np.ndarray
    probability: np.ndarray
    margin: np.ndarray
    risk: np.ndarray
    flipped_probability: np.ndarray  # the model's probability with only the sex flipped
    flipped_risk: np.ndarray  # the risk with only the recorded sex flipped
    static_raw: np.ndarray

    def take(self, index: np.ndarray) -> Scored:
        return Scored(*(getattr(self, k)[index] for k in self.__dataclass_fields__))

    @classmethod
    def concat(cls, parts: list[Scored]) -> Scored:
        return cls(*(np.concatenate([getattr(p, k) for p in parts])
                     for k in cls.__dataclass_fields__))


class ExportedModel:
    """An exported model folder run with ONNX Runtime on split arrays, as the service runs it."""

    def __init__(self, folder: Path, binary_only: bool = True) -> None:
        """`binary_only`: refuse a multi-label model (external validation scores class 0);
        `outputs` serves every class either way."""
        import onnxruntime as ort

        self.folder = Path(folder)
        for name in ("manifest.json", "model.onnx"):
            if not (self.folder / name).is_file():
                raise FileNotFoundError(f"{self.folder} is not an exported model folder: "
                                        f"{name} is missing")
        self.manifest: Manifest = load_manifest(self.folder / "manifest.json")
        if binary_only and not task_spec(self.manifest.task).binary:
            raise ValueError(f"external validation scores a binary task; {self.folder} is "
                             f"{self.manifest.task!r}")
        self.fs = FeatureSet.from_dict(self.manifest.feature_set)
        self.normalizer = Normalizer.from_dict(self.manifest.normalizer)
        self.static = (StaticImputer.from_dict(self.manifest.static)
                       if self.manifest.encoder.uses_static and self.manifest.static else None)
        self.neutral = [i for i, v in enumerate(self.fs.variable_ids)
                        if self.manifest.coverage.get(v, 1.0) <= 0.0]
        self.session = ort.InferenceSession(str(self.folder / "model.onnx"),
                                            providers=["CPUExecutionProvider"])

    @property
    def card(self) -> ClassCard:
        return self.manifest.classes[0]

    def load(self, data: Path, split: str) -> SplitArrays:
        return load_split(data, self.manifest.task, split, self.fs)

    def outputs(self, x: np.ndarray, lengths: np.ndarray, static_raw: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
        """(probability, margin), each [N, C], for un-normalised arrays."""
        x = self.normalizer.transform(neutralise(x, lengths, self.fs, self.neutral), lengths)
        probs, margins = [], []
        for i in range(0, len(x), BATCH):
            feed = {INPUT_X: x[i : i + BATCH],
                    INPUT_LENGTHS: lengths[i : i + BATCH].astype(np.int64)}
            if self.static is not None:
                feed[INPUT_STATIC] = self.static.transform(static_raw[i : i + BATCH])
            logits, prob = self.session.run([OUTPUT_ANCHOR_LOGITS, OUTPUT_PROBABILITY], feed)
            probs.append(prob)
            margins.append(logits[..., 0] - logits[..., 1])
        return np.concatenate(probs).astype(np.float64), np.concatenate(margins).astype(
            np.float64)

    def risks(self, a: SplitArrays) -> np.ndarray:
        """[N, C] served risks of a split: every class's calibration map on its outputs."""
        p, m = self.outputs(a.x, a.lengths, a.static_raw)
        return np.stack([card.calibration.apply(p[:, c], m[:, c])
                         for c, card in enumerate(self.manifest.classes)], axis=1)

    def _outputs(self, x: np.ndarray, lengths: np.ndarray, static_raw: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
        """(probability, margin) of class 0 for un-normalised arrays."""
        p, m = self.outputs(x, lengths, static_raw)
        return p[:, 0], m[:, 0]

    def score(self, a: SplitArrays, absent: list[int] | None = None) -> Scored:
        """The split scored; `absent` channels (indices) as if never recorded in any stay."""
        if not len(a):
            raise ValueError(f"the {a.split} split of {a.task} is empty")
        if absent:
            a = replace(a, x=neutralise(a.x, a.lengths, self.fs, absent))
        p, m = self._outputs(a.x, a.lengths, a.static_raw)
        pf, mf = self._outputs(a.x, a.lengths, fairness.flip_sex(a.static_raw))
        cal = self.card.calibration
        return Scored(a.y[:, 0].astype(np.float64), p, m, cal.apply(p, m), pf,
                      cal.apply(pf, mf), a.static_raw)

    def default_alerts(self, s: Scored, flipped: bool = False) -> tuple[np.ndarray, str]:
        """The default alerts of the stays as scored (or with their sex flipped), and the rule
        in words."""
        if flipped:
            return default_alerts(self.card, s.flipped_probability, s.flipped_risk)
        return default_alerts(self.card, s.probability, s.risk)


def default_alerts(card: ClassCard, probability: np.ndarray, risk: np.ndarray
                   ) -> tuple[np.ndarray, str]:
    """A model's own default alert (its default named point on the risk, or contract 1.0's
    threshold on the model's probability) and the rule in words."""
    point = {p.name: p for p in card.named_points}.get(card.default_operating_point or "")
    if point is not None:
        return risk >= point.threshold, (f"risk >= {point.threshold:.4f} (the model's default "
                                         f"operating point `{point.name}`)")
    return probability >= card.default_threshold, (
        f"probability >= {card.default_threshold:.4f} (the model's default alert threshold)")


def neutralise(x: np.ndarray, lengths: np.ndarray, fs: FeatureSet, channels: list[int]
               ) -> np.ndarray:
    """`x` with `channels` never observed (normal value, mask 0), as the service treats a
    channel the model never saw in training."""
    if not channels:
        return x
    empty, _ = discretize(Observations([], [], [], [], 1), fs, float(fs.window_hours or 1.0))
    out = np.array(x, copy=True)
    valid = np.arange(x.shape[1])[None, :] < lengths[:, None]
    for c in channels:
        cols = fs.channel_columns[c]
        out[..., cols] = np.where(valid[..., None], empty[0, 0, cols], 0.0)
    return out
