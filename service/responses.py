"""The answer to each scored stay: a `Prediction`, built class by class from the read-outs.

One response per response version (`RESPONSE_VERSIONS`): the current one, and the previous
one with its deprecated aliases after the other fields of each class. A stay below the
model's data minimum gets an abstention (no risk, the reasons) unless the request allows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from scehr.schemas.contract import PREVIOUS_RESPONSE_VERSION, RESPONSE_VERSION
from scehr.schemas.explanation_screen import SCREENED_NOTICE
from scehr.schemas.payloads import Audit, Contribution, Notice, Prediction, PredictionV1_1
from scehr.schemas.sufficiency import DataSummary, shortfalls
from scehr.schemas.uncertainty import WIDE_INTERVAL, RiskUncertainty
from scehr.service.batcher import ModelOutputs
from scehr.service.explain import DEFAULT_EXPLAIN, LEVELS
from scehr.service.model import ModelSpec, ReadOuts, read_out
from scehr.service.operating import Choice
from scehr.service.pipeline import PreparedStays

#: Nearest prototypes shown per class.
N_PROTOTYPES = 3
#: Notices about how the model's input was filled in, untrue of an answer that computed no
#: risk (an abstention keeps the others: they are about the data).
SCORED_ONLY_NOTICES = frozenset({"channel_not_observed", SCREENED_NOTICE})


def alerts(choice: Choice, risk: np.ndarray, probability: np.ndarray) -> np.ndarray:
    """[n, C] alerts of a chosen point (on the model's probability only where the point
    says so)."""
    return np.where(choice.on_score[None], probability, risk) >= choice.thresholds[None]


def _margin_percentile(spec: ModelSpec, c: int, m: np.ndarray
                       ) -> list[dict[str, Any] | None]:
    """Per row, a MarginPercentile's fields (validated with the whole Prediction)."""
    ref = spec.assets.margins[c]
    if ref is None:
        return [None] * len(m)
    neg, pos = ref.percentile(m)
    out = []
    for r in range(len(m)):
        a = None if neg is None else round(float(neg[r]), 1)
        b = None if pos is None else round(float(pos[r]), 1)
        parts = [f"{v:g}% of held-out stays {who}" for v, who in
                 ((a, "without the outcome"), (b, "with it")) if v is not None]
        out.append({"without_outcome": a, "with_outcome": b,
                    "summary": "closer to the outcome anchor than " + " and ".join(parts)})
    return out


def risk_intervals(u: RiskUncertainty | None, risk: np.ndarray) -> list[dict[str, Any] | None]:
    """Per row, a RiskInterval's fields (None: the model has no uncertainty map)."""
    if u is None:
        return [None] * len(risk)
    low, high = u.served_interval(risk)
    event, no_event = u.outcome_set(risk)
    wide = (high - low) >= WIDE_INTERVAL
    return [{"low": lo, "high": hi, "wide": w, "level": u.level,
             "outcomes": [k for k, keep in (("outcome", e), ("no_outcome", ne)) if keep]}
            for lo, hi, w, e, ne in zip(low.tolist(), high.tolist(), wide.tolist(),
                                        event.tolist(), no_event.tolist(), strict=True)]


def _answer_model(version: str) -> type[Prediction]:
    """The response model of a response version (`RESPONSE_VERSIONS`)."""
    return PredictionV1_1 if version == PREVIOUS_RESPONSE_VERSION else Prediction


@dataclass
class _Table:
    """The read-outs of the scored stays, as Python lists by [stay][class] (one `tolist`
    per array for the whole batch, not one float per field), and per class what its results
    share: the chosen point, the margin percentiles, the risk intervals, the nearest
    prototypes and the contributions."""

    lists: dict[str, list[list[Any]]]
    points: list[dict[str, Any]]
    pct: list[list[dict[str, Any] | None]]
    intervals: list[list[dict[str, Any] | None]]
    near: list[tuple[np.ndarray, np.ndarray] | None]
    contrib: list[list[tuple[list[Contribution], int]]] | None


def _table(spec: ModelSpec, prep: PreparedStays, out: ModelOutputs, choice: Choice,
           sc: ReadOuts, explain: str) -> _Table:
    n = len(prep.ok)
    z = out.z.astype(np.float64)[:n]
    al = out.anchor_logits.astype(np.float64)[:n]
    risk, raw, mn = sc.risk[:n], sc.probability[:n], sc.margin[:n]
    alert = alerts(choice, risk, raw)
    cos_u, cos_v = spec.assets.anchor_cosines(z)
    near = spec.assets.nearest_prototypes(z, N_PROTOTYPES)
    labels = spec.assets.labels
    lists = {k: a.tolist() for k, a in (("p", raw), ("r", risk), ("alert", alert),
                                         ("u", al[:, :, 0]), ("v", al[:, :, 1]), ("m", mn),
                                         ("cu", cos_u), ("cv", cos_v))}
    pct = [_margin_percentile(spec, c, mn[:, c]) for c in range(len(labels))]
    intervals = [risk_intervals(card.uncertainty, risk[:, c])
                 for c, card in enumerate(spec.manifest.classes)]
    source = "default" if choice.source == "default" else "request"
    points = [{"name": choice.used[c],
               "threshold": None if np.isnan(choice.thresholds[c])
               else float(choice.thresholds[c]),
               "applies_to": "score" if choice.on_score[c] else "risk", "source": source,
               "withheld": choice.reason(c)}
              for c in range(len(labels))]
    level = LEVELS[explain]
    contrib = None
    if prep.occluded and level.occlusion:
        contrib = _contributions(spec, prep, sc, level.contributions)
    return _Table(lists, points, pct, intervals, near, contrib)


def _prototypes(spec: ModelSpec, t: _Table, r: int, c: int) -> list[dict[str, Any]]:
    """Row `r`'s nearest prototypes of class `c`, nearest first."""
    near = t.near[c]
    if near is None:
        return []
    pi, pc = near
    ps = spec.assets.prototypes[c]
    assert ps is not None
    protos = []
    for j in range(pi.shape[1]):
        k = int(pi[r, j])
        protos.append({
            "name": ps.names[k], "cluster": k, "count": int(ps.count[k]),
            "outcome_rate": float(ps.outcome_rate[k]), "ci_low": float(ps.ci_low[k]),
            "ci_high": float(ps.ci_high[k]), "cosine": float(pc[r, j])})
    return protos


def _class_result(spec: ModelSpec, t: _Table, r: int, c: int, aliases: bool
                  ) -> dict[str, Any]:
    """Row `r`'s result for class `c`, as the fields of a `ClassResult` (plain values,
    validated with the whole Prediction)."""
    lists = t.lists
    m = lists["m"][r][c]
    rc = None if t.contrib is None else t.contrib[r][c]
    cls: dict[str, Any] = {
        "label": spec.assets.labels[c], "risk": lists["r"][r][c], "score": lists["p"][r][c],
        "alert": lists["alert"][r][c], "operating_point": t.points[c],
        "risk_interval": t.intervals[c][r],
        "explanation": {
            "positive_logit": lists["u"][r][c], "negative_logit": lists["v"][r][c],
            "margin": m, "margin_percentile": t.pct[c][r],
            "nearer_anchor": "positive" if m > 0 else "negative",
            "cosine_positive": lists["cu"][r][c], "cosine_negative": lists["cv"][r][c]},
        "prototypes": _prototypes(spec, t, r, c),
        "contributions": None if rc is None else rc[0],
        "contributions_total": None if rc is None else rc[1],
    }
    if aliases:  # response 1.1's deprecated 1.0 names, after the others
        cls.update({"probability": lists["p"][r][c], "calibrated_probability": lists["r"][r][c],
                    "threshold": t.points[c]["threshold"],
                    "prototype": _nearest_prototype(spec, c, t.near[c], r)})
    return cls


def _notices(prep: PreparedStays, idx: int, choice: Choice, enough: dict[str, Any] | None
             ) -> list[Notice]:
    """A scored stay's notices: the data's, then why it was scored below the minimum and
    which classes fell back from the point the request named."""
    notices = prep.notices[idx]
    if enough is not None and not enough["meets_minimum"]:
        notices = [*notices, Notice(
            code="below_data_minimum", message="scored on request "
            "(allow_insufficient=true) although the stay is below the model's data "
            "minimum: " + "; ".join(enough["reasons"]))]
    # A point the client asked for that some classes lack is worth a warning; the model's
    # own default falling back per class is its design, shown in each result's point.
    fallback = sorted({u for u in choice.used if u not in (choice.name, "none")})
    if fallback and choice.source == "request":
        notices = [*notices, Notice(
            code="operating_point_unavailable",
            message=f"operating point {choice.name!r} is not defined for some labels; "
            f"they used {', '.join(fallback)} (see each result's operating_point)")]
    return notices


def audit_record(spec: ModelSpec, prep: PreparedStays, r: int, point: str,
                 response_version: str) -> Audit:
    """Row `r`'s audit record; `point`: the name of what its alerts are raised by."""
    return Audit(model_version=spec.ref.version, model_sha256=spec.ref.sha256,
                 feature_set_hash=spec.fs_hash, operating_point=point,
                 input_sha256=prep.input_sha256[r], response_version=response_version)


def predictions(spec: ModelSpec, prep: PreparedStays, out: ModelOutputs, *,
                choice: Choice | None = None, explain: str = DEFAULT_EXPLAIN,
                readouts: ReadOuts | None = None,
                response_version: str = RESPONSE_VERSION) -> dict[int, Prediction]:
    """One Prediction per stay that passed, keyed by its input index.

    explain: a level of `scehr.service.explain.LEVELS` (contributions need the occlusion rows
    `prepare` adds for it). response_version: the current one, or the previous one (with its
    deprecated aliases)."""
    model = _answer_model(response_version)
    aliases = model is PredictionV1_1
    choice = choice or spec.points.default_choice()
    t = _table(spec, prep, out, choice, readouts or read_out(spec, out), explain)
    n_classes = len(spec.assets.labels)
    # Plain dicts, validated once per stay: one call into pydantic-core for the whole nested
    # response instead of one model __init__ per class, prototype and explanation.
    result: dict[int, Prediction] = {}
    minimum = spec.manifest.data_minimum
    for r, idx in enumerate(prep.ok):
        enough = sufficiency(prep.data[r], minimum) if prep.data else None
        if enough is not None and not enough["meets_minimum"] \
                and not choice.allow_insufficient:
            result[idx] = abstention(spec, prep, r, idx, choice, enough, response_version)
            continue
        result[idx] = model.model_validate({
            "response_version": response_version, "id": prep.ids[idx], "model": spec.ref,
            "results": [_class_result(spec, t, r, c, aliases) for c in range(n_classes)],
            "warnings": _notices(prep, idx, choice, enough), "sufficiency": enough,
            "audit": audit_record(spec, prep, r, choice.name, response_version)})
    return result


def _nearest_prototype(spec: ModelSpec, c: int, near: tuple[np.ndarray, np.ndarray] | None,
                       r: int) -> dict[str, Any] | None:
    """Response 1.1's deprecated `prototype` of row `r`, class `c`: the nearest prototype with
    the label it was fitted in."""
    if near is None:
        return None
    pi, pc = near
    ps = spec.assets.prototypes[c]
    assert ps is not None
    k = int(pi[r, 0])
    return {"label": int(ps.label[k]), "cluster": k, "count": int(ps.count[k]),
            "outcome_rate": float(ps.outcome_rate[k]), "cosine": float(pc[r, 0])}


def sufficiency(data: DataSummary, minimum: Any) -> dict[str, Any] | None:
    """The response's `sufficiency` of one stay (None when the model declares no minimum)."""
    if minimum is None:
        return None
    why = shortfalls(data, minimum)
    return {"meets_minimum": not why, "reasons": why, **data.as_dict()}


def abstention(spec: ModelSpec, prep: PreparedStays, r: int, idx: int, choice: Choice,
               enough: dict[str, Any], response_version: str = RESPONSE_VERSION) -> Prediction:
    """The answer for a stay below the data minimum: no risk, no alert, the reasons, and the
    notices about the data (none about filling in a model input that was never scored)."""
    return _answer_model(response_version).model_validate({
        "response_version": response_version, "id": prep.ids[idx], "model": spec.ref,
        "status": "insufficient_data", "results": [], "sufficiency": enough,
        "warnings": [n for n in prep.notices[idx] if n.code not in SCORED_ONLY_NOTICES],
        "audit": audit_record(spec, prep, r, choice.name, response_version)})


def _direction(d: float) -> str:
    return "neutral" if abs(d) < 1e-6 else ("raises" if d > 0 else "lowers")


def _contributions(spec: ModelSpec, prep: PreparedStays, sc: ReadOuts, top: int | None
                   ) -> list[list[tuple[list[Contribution], int]]]:
    """Per stay, per class: channels by |Δrisk| of replacing them with 'not observed' (the
    first `top` of them, or all), and how many channels were evaluated."""
    n = len(prep.ok)
    row = n
    out = []
    for s, chans in enumerate(prep.occluded):
        k = len(chans)
        dr = sc.risk[s][None, :] - sc.risk[row : row + k]  # [K, C]
        dp = sc.probability[s][None, :] - sc.probability[row : row + k]
        dm = sc.margin[s][None, :] - sc.margin[row : row + k]
        row += k
        per_class = []
        for c in range(sc.risk.shape[1]):
            # ties on the risk (a flat piece of an isotonic map) are broken by the probability
            order = np.lexsort((-np.abs(dp[:, c]), -np.abs(dr[:, c])))[:top]
            per_class.append(([
                Contribution(variable=spec.fs.variable_ids[int(chans[j])],
                             delta=float(dr[j, c]), direction=_direction(float(dr[j, c])),
                             delta_score=float(dp[j, c]), delta_margin=float(dm[j, c]))
                for j in order
            ], k))
        out.append(per_class)
    return out
