"""External validation: score an exported model (ONNX + manifest) on any converted dataset,
before and after a site recalibration, and write that recalibration as a new model version.

The stays are read with the model's own feature set and normalised with its manifest, and the
ONNX graph is run with ONNX Runtime, so the figures are those of the exported artifact (the
service's tensors), not of a checkpoint. A channel the model never saw in training is treated
as not observed, as the service does. The site's data are used as its converter split them (by
patient): the recalibration map is fitted on the site's train split, chosen on its val split
(the existing rule of `scehr.training.export.fit_calibration`), and both maps are scored on its test
split, which neither saw. Figures on all the site's stays are given for the shipped model.
"""

from __future__ import annotations

import datetime as dt
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from scehr.schemas.contract import (
    INPUT_LENGTHS,
    INPUT_STATIC,
    INPUT_X,
    OUTPUT_ANCHOR_LOGITS,
    OUTPUT_PROBABILITY,
)
from scehr.schemas.featureset import FeatureSet
from scehr.schemas.manifest import Calibration, ClassCard, Manifest, load_manifest
from scehr.schemas.model_index import add_model, entry_for, refuse_existing
from scehr.schemas.tasks import task_spec
from scehr.schemas.tensorize import Normalizer, Observations, StaticImputer, discretize
from scehr.training import fairness
from scehr.training.bootstrap import bootstrap_ci
from scehr.training.challenge2012 import event1
from scehr.training.data.splits import SplitArrays, load_split
from scehr.training.risk_figures import RISK_METRICS

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


def risk_metrics(y: np.ndarray, risk: np.ndarray, alerts: np.ndarray, alert_rule: str,
                 n_boot: int, seed: int) -> dict[str, Any]:
    """Discrimination and calibration of `risk` with 95% bootstrap CIs; Event 1 of `alerts`."""
    out: dict[str, Any] = {"n": len(y), "deaths": int(y.sum()), "alert_rule": alert_rule,
                           "mean_risk": float(risk.mean()), "observed_rate": float(y.mean())}
    for name, fn in RISK_METRICS.items():
        out[name] = bootstrap_ci(fn, y, risk, n_boot=n_boot, seed=seed)
    out["event1"] = bootstrap_ci(event1, y, alerts.astype(np.float64), n_boot=n_boot, seed=seed)
    out["alert_rate"] = float(alerts.mean())
    return out


def fit_site_calibration(model: ExportedModel, fit: Scored, choose: Scored, where: str
                         ) -> Calibration:
    """The export's calibration rule (temperature / Platt / isotonic / none, best validation
    Brier), fitted on the site's stays `fit` and chosen on `choose`."""
    from scehr.training.losses import POSITIVE_ANCHOR_ONLY
    from scehr.training.serving_assets import fit_calibration

    kind = "probability" if model.manifest.loss.name in POSITIVE_ANCHOR_ONLY else "margin"
    return fit_calibration((fit.y, fit.probability, fit.margin),
                           (choose.y, choose.probability, choose.margin), where, kind)


def recalibrate(folder: Path, data: Path, out: Path, version: str | None = None
                ) -> tuple[Path, list[str]]:
    """Write a new model version: the same ONNX graph with a calibration map fitted on the
    site's train split (chosen on its val split), operating points and the risk reference
    re-chosen on the site's val split; registered in `<out>/../../index.json`.

    The shipped folder is never modified; the new one says in its notes and model card where
    its map comes from.
    """
    from scehr.training.export import manifest_json, named_points, risk_reference
    from scehr.training.model_card import write_model_card
    from scehr.training.site_report import REPORT_FOLDER, write_report

    model = ExportedModel(folder)
    m = model.manifest
    version = version or out.name
    refuse_existing(out.parent.parent, m.task, version, out)
    scored = {s: model.score(model.load(data, s)) for s in SPLITS}
    where = (f"site recalibration on {Path(data).name}: fitted on its train split "
             f"({len(scored['train'].y)} stays), chosen on its val split")
    cal = fit_site_calibration(model, scored["train"], scored["val"], where)
    val, test = scored["val"], scored["test"]
    val_risk = cal.apply(val.probability, val.margin)
    card = model.card.model_copy(update={"calibration": cal})
    if m.contract_version != "1.0":  # contract 1.1: points and drift baseline on the risk
        named = named_points((val.y, val_risk), (test.y, cal.apply(test.probability,
                                                                   test.margin)))
        names = [p.name for p in named]
        card = card.model_copy(update={
            "named_points": named, "risk_reference": risk_reference(val_risk),
            "default_operating_point": (card.default_operating_point
                                        if card.default_operating_point in names
                                        else (names[0] if names else None))})
    test_risk = cal.apply(test.probability, test.margin)
    note = (f"site-recalibrated from {m.name} {m.version} on {Path(data).name} with scehr "
            "recalibrate; the ONNX graph is unchanged")
    new = m.model_copy(update={
        "version": version, "classes": [card, *m.classes[1:]],
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "notes": [*m.notes, note],
        "metrics": {**m.metrics, "site_recalibration": {
            "data": str(data), "fitted_on": cal.fitted_on, "method": cal.method,
            "site_test": risk_metrics(test.y, test_risk,
                                      *default_alerts(card, test.probability, test_risk),
                                      n_boot=200, seed=0)}}})
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model.folder / "model.onnx", out / "model.onnx")
    (out / "manifest.json").write_text(manifest_json(new))
    write_model_card(out, new, f"scehr recalibrate {folder} --data {data} --out {out}",
                     [f"Calibration map refitted on {Path(data).name} ({cal.method}); the test "
                      "metrics above are the original model's on its own test set."])
    write_report(folder, data, out / REPORT_FOLDER, compare=out, split="test",
                 command=f"scehr recalibrate {folder} --data {data} --out {out}",
                 title=f"{m.task} {version} (site) against {m.version} on the site's test split")
    changes = add_model(out.parent.parent, entry_for(out, out.parent.parent, new),
                        set_default=False)
    return out, changes
