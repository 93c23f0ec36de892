"""Payloads -> model inputs -> predictions: the whole per-request path except the ORT call.

Used by the HTTP routes and, unchanged, by in-process callers (benchmarks, batch jobs), so both
score a stay identically. Validation and tensorization are the shared `schemas` code training
uses; this module adds what only serving needs: neutralising channels the model never saw in
training, occlusion variants for `explain=full`, and the read-outs of the outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import ValidationError

from schemas.featureset import FeatureSet
from schemas.ingest import DEFAULT_MAX_OBSERVATIONS, ingest
from schemas.manifest import Manifest
from schemas.payloads import (
    AnchorExplanation,
    ClassResult,
    Contribution,
    ModelRef,
    Notice,
    Prediction,
    Problem,
    Prototype,
    StayPayload,
)
from schemas.tensorize import Normalizer, Observations, StaticImputer, discretize
from service.batcher import ModelInputs, ModelOutputs
from service.explain import ExplainAssets


def _num(v: object) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def pydantic_problems(err: ValidationError | list[dict[str, Any]],
                      prefix: tuple[str | int, ...] = ()) -> list[Problem]:
    """pydantic errors as Problems: field path, rule (the error type), allowed range if known."""
    errors = err.errors(include_input=False) if isinstance(err, ValidationError) else err
    out = []
    for e in errors:
        ctx = e.get("ctx") or {}
        allowed = None
        bounds = [f"{op} {_num(ctx[k])}" for k, op in (("ge", ">="), ("gt", ">"), ("le", "<="),
                                                  ("lt", "<")) if k in ctx]
        if bounds:
            allowed = " and ".join(bounds)
        elif "expected" in ctx:
            allowed = str(ctx["expected"])
        elif "max_length" in ctx:
            allowed = f"at most {ctx['max_length']} items/characters"
        elif "min_length" in ctx:
            allowed = f"at least {ctx['min_length']} items/characters"
        out.append(Problem(loc=[*prefix, *e.get("loc", ())], rule=str(e.get("type", "invalid")),
                           message=str(e.get("msg", "invalid value")), allowed=allowed))
    return out


def parse_stays(raw: list[Any]) -> list[StayPayload | list[Problem]]:
    """Validate each raw stay on its own, so one bad stay never fails the others."""
    out: list[StayPayload | list[Problem]] = []
    for i, d in enumerate(raw):
        try:
            out.append(StayPayload.model_validate(d))
        except ValidationError as e:
            out.append(pydantic_problems(e, ("body", "stays", i)))
    return out


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
        ref = ModelRef(task=m.task, name=m.name, version=m.version, sha256=sha256,
                       feature_set=fs.name, loss=m.loss.name)
        return cls(m.task, m, ref, fs, Normalizer.from_dict(m.normalizer), static,
                   ExplainAssets.from_manifest(m), np.asarray(neutral, dtype=np.int64), fixed_t)


@dataclass
class Prepared:
    """Model rows for the stays that passed (then their occlusion variants), per-stay notes."""

    n: int
    ok: list[int]
    problems: dict[int, list[Problem]]
    notices: list[list[Notice]]
    ids: list[str | None]
    inputs: ModelInputs | None = None
    occluded: list[np.ndarray] = field(default_factory=list)  # per ok stay: channels occluded


def _neutralise(spec: ModelSpec, obs: Observations, ok: list[int],
                notices: list[list[Notice]]) -> Observations:
    if spec.neutralised.size == 0:
        return obs
    hit = np.isin(obs.channel, spec.neutralised)
    if not hit.any():
        return obs
    for s, ch in sorted(set(zip(obs.stay[hit].tolist(), obs.channel[hit].tolist(),
                                strict=True))):
        vid = spec.fs.variable_ids[ch]
        notices[ok[s]].append(Notice(
            code="channel_not_seen_in_training", variable=vid,
            message=f"{vid} was never observed in this model's training data: it is treated "
            "as not observed"))
    return obs.take(~hit)


def _variants(obs: Observations, n_ok: int, end_hours: np.ndarray,
              ) -> tuple[Observations, list[np.ndarray], np.ndarray]:
    """Append one copy of each stay per channel observed in its window, with it removed."""
    parts_stay, parts_idx, occluded, src = [], [], [], []
    next_id = n_ok
    by_stay = np.argsort(obs.stay, kind="stable")
    bounds = np.searchsorted(obs.stay[by_stay], np.arange(n_ok + 1))
    for s in range(n_ok):
        rows = by_stay[bounds[s] : bounds[s + 1]]
        chans = np.unique(obs.channel[rows[obs.time[rows] <= end_hours[s] + 1e-6]])
        occluded.append(chans)
        for k in chans:
            keep = rows[obs.channel[rows] != k]
            parts_idx.append(keep)
            parts_stay.append(np.full(len(keep), next_id, dtype=np.int64))
            src.append(s)
            next_id += 1
    if not parts_idx:
        return obs, occluded, np.arange(n_ok)
    idx = np.concatenate([np.arange(len(obs)), *parts_idx])
    stay = np.concatenate([obs.stay, *parts_stay])
    out = Observations(stay, obs.channel[idx], obs.time[idx], obs.value[idx], next_id)
    return out, occluded, np.concatenate([np.arange(n_ok), np.asarray(src, dtype=np.int64)])


def prepare(spec: ModelSpec, stays: list[StayPayload], *, strict: bool = False,
            max_observations: int = DEFAULT_MAX_OBSERVATIONS,
            explain_full: bool = False) -> Prepared:
    """Validate, clean, neutralise and tensorize; problems and notices are kept per stay."""
    res = ingest(stays, spec.fs, strict=strict, max_observations=max_observations)
    notices = [list(s.notices) for s in res.stays]
    problems = {i: s.problems for i, s in enumerate(res.stays) if s.problems}
    prep = Prepared(len(stays), res.ok, problems, notices, [s.id for s in stays])
    if not res.ok:
        return prep
    obs = _neutralise(spec, res.observations, res.ok, notices)
    src = np.arange(len(res.ok))
    if explain_full:
        obs, prep.occluded, src = _variants(obs, len(res.ok), res.end_hours)
    x, lengths = discretize(obs, spec.fs, res.end_hours[src])
    if spec.fixed_t is not None and x.shape[1] < spec.fixed_t:
        x = np.pad(x, ((0, 0), (0, spec.fixed_t - x.shape[1]), (0, 0)))
    x = spec.normalizer.transform(x, lengths)
    static = None
    if spec.static is not None:
        static = spec.static.transform(res.static_raw[src])
    prep.inputs = ModelInputs(x, lengths.astype(np.int64), static)
    return prep


def predictions(spec: ModelSpec, prep: Prepared, out: ModelOutputs) -> dict[int, Prediction]:
    """One Prediction per stay that passed, keyed by its input index."""
    n = len(prep.ok)
    z = out.z.astype(np.float64)
    al = out.anchor_logits.astype(np.float64)
    p = out.probability.astype(np.float64)
    margin = al[..., 0] - al[..., 1]
    pn, mn, zn = p[:n], margin[:n], z[:n]
    cal = spec.assets.calibrate(pn, mn)
    alert = pn >= spec.assets.thresholds  # operating points are on the model's probability
    cos_u, cos_v = spec.assets.anchor_cosines(zn)
    near = spec.assets.nearest_prototypes(zn)
    labels, thr = spec.assets.labels, spec.assets.thresholds.tolist()
    lists = {k: a.tolist() for k, a in (("p", pn), ("cal", cal), ("alert", alert),
                                         ("u", al[:n, :, 0]), ("v", al[:n, :, 1]), ("m", mn),
                                         ("cu", cos_u), ("cv", cos_v))}
    contrib = _contributions(spec, prep, p, margin) if prep.occluded else None
    result: dict[int, Prediction] = {}
    for r, idx in enumerate(prep.ok):
        classes = []
        for c, label in enumerate(labels):
            m = lists["m"][r][c]
            proto = None
            if near[c] is not None:
                pi, pc = near[c]
                ps = spec.assets.prototypes[c]
                k = int(pi[r])
                proto = Prototype(label=int(ps.label[k]), cluster=k, count=int(ps.count[k]),
                                  outcome_rate=float(ps.outcome_rate[k]), cosine=float(pc[r]))
            classes.append(ClassResult(
                label=label, probability=lists["p"][r][c],
                calibrated_probability=lists["cal"][r][c],
                alert=lists["alert"][r][c], threshold=thr[c],
                explanation=AnchorExplanation(
                    positive_logit=lists["u"][r][c], negative_logit=lists["v"][r][c], margin=m,
                    nearer_anchor="positive" if m > 0 else "negative",
                    cosine_positive=lists["cu"][r][c], cosine_negative=lists["cv"][r][c]),
                prototype=proto,
                contributions=None if contrib is None else contrib[r][c],
            ))
        result[idx] = Prediction(id=prep.ids[idx], model=spec.ref, results=classes,
                                 warnings=prep.notices[idx])
    return result


def _contributions(spec: ModelSpec, prep: Prepared, p: np.ndarray,
                   margin: np.ndarray) -> list[list[list[Contribution]]]:
    """Per stay, per class: channels sorted by |Δp| of replacing them with 'not observed'."""
    n = len(prep.ok)
    row = n
    out = []
    for s, chans in enumerate(prep.occluded):
        k = len(chans)
        dp = p[s][None, :] - p[row : row + k]  # [K, C]
        dm = margin[s][None, :] - margin[row : row + k]
        row += k
        per_class = []
        for c in range(p.shape[1]):
            order = np.argsort(-np.abs(dp[:, c]), kind="stable")
            per_class.append([
                Contribution(variable=spec.fs.variable_ids[int(chans[j])],
                             delta=float(dp[j, c]), delta_margin=float(dm[j, c]))
                for j in order
            ])
        out.append(per_class)
    return out
