"""Payloads -> model inputs -> predictions: the whole per-request path except the ORT call.

Used by the HTTP routes and, unchanged, by in-process callers (benchmarks, batch jobs), so both
score a stay identically. Validation and tensorization are the shared `schemas` code training
uses; this module adds what only serving needs: neutralising channels the model never saw in
training, occlusion variants for `explain=full`, and the read-outs of the outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
from pydantic import ValidationError

from scehr.schemas.audit import feature_set_hash, input_hash
from scehr.schemas.contract import PREVIOUS_RESPONSE_VERSION, RESPONSE_VERSION
from scehr.schemas.featureset import FeatureSet
from scehr.schemas.ingest import DEFAULT_MAX_OBSERVATIONS, Stay, ingest
from scehr.schemas.manifest import Manifest
from scehr.schemas.payloads import (
    Audit,
    Contribution,
    ModelRef,
    Notice,
    Prediction,
    PredictionV1_1,
    Problem,
    StayPayload,
)
from scehr.schemas.profile import Bins, observed_mask, stays_observed, value_counts
from scehr.schemas.sufficiency import DataSummary, shortfalls, summarize
from scehr.schemas.tensorize import Normalizer, Observations, StaticImputer, discretize
from scehr.schemas.uncertainty import WIDE_INTERVAL, RiskUncertainty
from scehr.service.batcher import ModelInputs, ModelOutputs
from scehr.service.explain import ExplainAssets
from scehr.service.operating import Choice, PointTable

#: Contributions shown by default (`explain=top`); `explain=full` lists every observed channel.
TOP_CONTRIBUTIONS = 3
#: Nearest prototypes shown per class.
N_PROTOTYPES = 3
#: Notices about how the model's input was filled in, untrue of an answer that computed no
#: risk (an abstention keeps the others: they are about the data).
SCORED_ONLY_NOTICES = frozenset({"channel_not_observed"})


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


@dataclass
class PreparedStays:
    """Model rows for the stays that passed (then their occlusion variants), per-stay notes."""

    n: int
    ok: list[int]
    problems: dict[int, list[Problem]]
    notices: list[list[Notice]]
    ids: list[str | None]
    inputs: ModelInputs | None = None
    occluded: list[np.ndarray] = field(default_factory=list)  # per ok stay: channels occluded
    input_sha256: list[str] = field(default_factory=list)  # per ok stay
    observed: np.ndarray | None = None  # [n_ok, V] variable observed in the window
    values: np.ndarray | None = None  # [n_ok, V, width] observed hours per value bin
    data: list[DataSummary] = field(default_factory=list)  # per ok stay, inside the window
    rows: list[Any] = field(default_factory=list)  # per ok stay: () -> observation rows read


def _neutralise(spec: ModelSpec, obs: Observations, ok: list[int],
                notices: list[list[Notice]]) -> Observations:
    if spec.neutralised.size == 0:
        return obs
    neutral = np.zeros(spec.fs.n_channels, dtype=bool)  # a lookup: np.isin costs far more
    neutral[spec.neutralised] = True
    hit = neutral[obs.channel]
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


def _rows_read(spec: ModelSpec, st: Any, end: float) -> tuple[int, ...]:
    """The long-form `observations` indices of one ingested stay that reach the model:
    inside the window, of a channel seen in training (a value dropped as implausible never
    reaches `st.source`)."""
    keep = (st.time <= end + 1e-6) & (st.time >= -1e-6)
    if spec.neutralised.size:
        keep &= ~np.isin(st.channel, spec.neutralised)
    locs = (st.locate(int(r)) for r in st.source[keep].tolist())
    return tuple(int(loc[1]) for loc in locs
                 if len(loc) > 1 and loc[0] == "observations" and isinstance(loc[1], int))


def _observed_channels(obs: Observations, n_ok: int, end_hours: np.ndarray
                       ) -> list[np.ndarray]:
    """Per stay, the channels observed in its window: the ones occlusion removes in turn."""
    by_stay = np.argsort(obs.stay, kind="stable")
    bounds = np.searchsorted(obs.stay[by_stay], np.arange(n_ok + 1))
    out = []
    for s in range(n_ok):
        rows = by_stay[bounds[s] : bounds[s + 1]]
        out.append(np.unique(obs.channel[rows[obs.time[rows] <= end_hours[s] + 1e-6]]))
    return out


def _occlusion_rows(x: np.ndarray, unobserved: np.ndarray, occluded: list[np.ndarray],
                    fs: FeatureSet) -> tuple[np.ndarray, np.ndarray]:
    """The stays' rows, then per stay one copy per occluded channel with that channel's
    columns taken from `unobserved` (the same stay with nothing observed); and each row's
    stay.

    The same tensor as discretizing the stay without that channel's observations, at a
    fraction of the cost: a channel fills only its own value and mask columns (forward fill
    and the normal value are per channel) and normalization is per column
    (tests/service/test_svc_occlusion_rows.py compares the two on real stays)."""
    cols = fs.channel_columns
    src = np.concatenate([np.arange(len(x)),
                          np.repeat(np.arange(len(x)), [len(c) for c in occluded])])
    out = x[src]
    row = len(x)
    for s, chans in enumerate(occluded):
        for k in chans.tolist():
            out[row, :, cols[k]] = unobserved[s, :, cols[k]]
            row += 1
    return out, src


def _tensor(spec: ModelSpec, obs: Observations, end_hours: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """Discretized (not yet normalized) rows, padded to the model's fixed length if any."""
    x, lengths = discretize(obs, spec.fs, end_hours)
    if spec.fixed_t is not None and x.shape[1] < spec.fixed_t:
        x = np.pad(x, ((0, 0), (0, spec.fixed_t - x.shape[1]), (0, 0)))
    return x, lengths


def prepare(spec: ModelSpec, stays: list[Stay], *, strict: bool = False,
            max_observations: int = DEFAULT_MAX_OBSERVATIONS,
            explain_full: bool = False) -> PreparedStays:
    """Validate, clean, neutralise and tensorize; problems and notices are kept per stay.

    `explain_full` adds one occlusion variant per observed channel of each stay (for
    contributions, `explain=top` or `full`)."""
    res = ingest(stays, spec.fs, strict=strict, max_observations=max_observations)
    notices = [list(s.notices) for s in res.stays]
    problems = {i: s.problems for i, s in enumerate(res.stays) if s.problems}
    prep = PreparedStays(len(stays), res.ok, problems, notices, [s.id for s in stays])
    if not res.ok:
        return prep
    obs = _neutralise(spec, res.observations, res.ok, notices)
    prep.data = summarize(obs, res.end_hours, spec.fs)
    prep.rows = [partial(_rows_read, spec, res.stays[i], float(res.end_hours[j]))
                 for j, i in enumerate(res.ok)]
    n = len(res.ok)
    x, lengths = _tensor(spec, obs, res.end_hours)
    static_raw = res.static_raw[:n] if spec.static is not None else None
    prep.input_sha256 = [input_hash(spec.fs_hash, x[i], int(lengths[i]),
                                    None if static_raw is None else static_raw[i])
                         for i in range(n)]
    seen = observed_mask(x, lengths, spec.fs)  # once, for both read-outs of the profile
    prep.observed = stays_observed(x, lengths, spec.fs, seen)
    if spec.bins is not None:
        prep.values = value_counts(x, lengths, spec.fs, spec.bins, seen)
    x = spec.normalizer.transform(x, lengths)
    src = np.arange(n)
    if explain_full:
        prep.occluded = _observed_channels(obs, n, res.end_hours)
        nothing = Observations(np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0), n)
        unobserved = spec.normalizer.transform(*_tensor(spec, nothing, res.end_hours))
        x, src = _occlusion_rows(x, unobserved, prep.occluded, spec.fs)
        lengths = lengths[src]
    static = None
    if static_raw is not None:
        static = spec.static.transform(static_raw[src])
    prep.inputs = ModelInputs(x, lengths.astype(np.int64), static)
    return prep


def tensor_rows(spec: ModelSpec, inputs: ModelInputs) -> PreparedStays:
    """PreparedStays for the graph's own tensors (Open Inference): no payload, no notices;
    observed variables from the mask columns (normalization leaves them as they are), no
    value bins (values are normalized); the audit's input hash is over the tensors as given."""
    n = inputs.rows
    sha = [input_hash(spec.fs_hash, inputs.x[i], int(inputs.lengths[i]),
                      None if inputs.static is None else inputs.static[i]) for i in range(n)]
    return PreparedStays(n, list(range(n)), {}, [[] for _ in range(n)], [None] * n, inputs,
                         input_sha256=sha,
                         observed=stays_observed(inputs.x, inputs.lengths, spec.fs))


@dataclass
class ReadOuts:
    """The read-outs of every row (stays, then their occlusion variants), [rows, C] each:
    the model's probability (the graph's output, reported as a result's `score`), the
    margin u^T z - v^T z, and the risk (the calibrated probability)."""

    probability: np.ndarray
    margin: np.ndarray
    risk: np.ndarray


def read_out(spec: ModelSpec, out: ModelOutputs) -> ReadOuts:
    al = out.anchor_logits.astype(np.float64)
    p = out.probability.astype(np.float64)
    margin = al[..., 0] - al[..., 1]
    return ReadOuts(p, margin, spec.assets.calibrate(p, margin))


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


def _intervals(u: RiskUncertainty | None, risk: np.ndarray) -> list[dict[str, Any] | None]:
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


def predictions(spec: ModelSpec, prep: PreparedStays, out: ModelOutputs, *,
                choice: Choice | None = None, explain: str = "basic",
                readouts: ReadOuts | None = None,
                response_version: str = RESPONSE_VERSION) -> dict[int, Prediction]:
    """One Prediction per stay that passed, keyed by its input index.

    explain: basic (anchors, margin percentiles, prototypes), top (+ the top
    TOP_CONTRIBUTIONS contributions; needs occlusion rows), full (+ every contribution).
    response_version: the current one, or the previous one (with its deprecated aliases)."""
    n = len(prep.ok)
    model = _answer_model(response_version)
    aliases = model is PredictionV1_1
    choice = choice or spec.points.default_choice()
    sc = readouts or read_out(spec, out)
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
    intervals = [_intervals(card.uncertainty, risk[:, c])
                 for c, card in enumerate(spec.manifest.classes)]
    source = "default" if choice.source == "default" else "request"
    points = [{"name": choice.used[c],
               "threshold": None if np.isnan(choice.thresholds[c])
               else float(choice.thresholds[c]),
               "applies_to": "score" if choice.on_score[c] else "risk", "source": source,
               "withheld": choice.reason(c)}
              for c in range(len(labels))]
    contrib = None
    if prep.occluded and explain in ("top", "full"):
        contrib = _contributions(spec, prep, sc, None if explain == "full" else
                                 TOP_CONTRIBUTIONS)
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
        classes = []
        for c, label in enumerate(labels):
            m = lists["m"][r][c]
            protos: list[dict[str, Any]] = []
            if near[c] is not None:
                pi, pc = near[c]
                ps = spec.assets.prototypes[c]
                assert ps is not None
                for j in range(pi.shape[1]):
                    k = int(pi[r, j])
                    protos.append({
                        "name": ps.names[k], "cluster": k, "count": int(ps.count[k]),
                        "outcome_rate": float(ps.outcome_rate[k]), "ci_low": float(ps.ci_low[k]),
                        "ci_high": float(ps.ci_high[k]), "cosine": float(pc[r, j])})
            rc = None if contrib is None else contrib[r][c]
            cls: dict[str, Any] = {
                "label": label, "risk": lists["r"][r][c], "score": lists["p"][r][c],
                "alert": lists["alert"][r][c], "operating_point": points[c],
                "risk_interval": intervals[c][r],
                "explanation": {
                    "positive_logit": lists["u"][r][c], "negative_logit": lists["v"][r][c],
                    "margin": m, "margin_percentile": pct[c][r],
                    "nearer_anchor": "positive" if m > 0 else "negative",
                    "cosine_positive": lists["cu"][r][c], "cosine_negative": lists["cv"][r][c]},
                "prototypes": protos,
                "contributions": None if rc is None else rc[0],
                "contributions_total": None if rc is None else rc[1],
            }
            if aliases:  # response 1.1's deprecated 1.0 names, after the others
                cls.update({"probability": lists["p"][r][c],
                            "calibrated_probability": lists["r"][r][c],
                            "threshold": points[c]["threshold"],
                            "prototype": _nearest_prototype(spec, c, near[c], r)})
            classes.append(cls)
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
        result[idx] = pred = model.model_validate({
            "response_version": response_version, "id": prep.ids[idx], "model": spec.ref,
            "results": classes, "warnings": notices, "sufficiency": enough,
            "audit": Audit(model_version=spec.ref.version, model_sha256=spec.ref.sha256,
                           feature_set_hash=spec.fs_hash, operating_point=choice.name,
                           input_sha256=prep.input_sha256[r],
                           response_version=response_version)})
        if prep.rows:
            pred._rows = prep.rows[r]
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
    pred = _answer_model(response_version).model_validate({
        "response_version": response_version, "id": prep.ids[idx], "model": spec.ref,
        "status": "insufficient_data", "results": [], "sufficiency": enough,
        "warnings": [n for n in prep.notices[idx] if n.code not in SCORED_ONLY_NOTICES],
        "audit": Audit(model_version=spec.ref.version, model_sha256=spec.ref.sha256,
                       feature_set_hash=spec.fs_hash, operating_point=choice.name,
                       input_sha256=prep.input_sha256[r], response_version=response_version)})
    if prep.rows:
        pred._rows = prep.rows[r]
    return pred


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
