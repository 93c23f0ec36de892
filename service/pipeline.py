"""Payloads -> model inputs: a request's stays prepared for the model's run.

Used by the scorer and, unchanged, by in-process callers (benchmarks, batch jobs), so both
score a stay identically. Validation and tensorization are the shared `schemas` code training
uses; this module adds what only serving needs: neutralising channels the model never saw in
training and the occlusion variants contributions are read from. The answers are built from
the outputs by `scehr.service.responses`; the model's own data is `scehr.service.model.ModelSpec`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
from pydantic import ValidationError

from scehr.schemas.audit import input_hash
from scehr.schemas.explanation_screen import SCREENED_NOTICE, candidates
from scehr.schemas.featureset import FeatureSet
from scehr.schemas.ingest import DEFAULT_MAX_OBSERVATIONS, Stay, _long_loc, ingest
from scehr.schemas.payloads import Notice, Problem, StayPayload
from scehr.schemas.profile import observed_mask, stays_observed, value_counts
from scehr.schemas.sufficiency import DataSummary, summarize
from scehr.schemas.tensorize import Observations, discretize
from scehr.service.batcher import ModelInputs
from scehr.service.model import ModelSpec


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
    #: per ok stay: () -> (observation rows read, each one's time in hours)
    rows_at: list[Any] = field(default_factory=list)
    #: the observations that reached the model (stay k: the k-th ok stay), for the data up to
    #: each hour of a trajectory
    observations: Observations | None = None
    data_end: list[float] = field(default_factory=list)  # per ok stay: `data_end`


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
    return _rows_read_at(spec, st, end)[0]


def _rows_read_at(spec: ModelSpec, st: Any, end: float
                  ) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """`_rows_read` and each row's time (hours since admission): the rows read up to any
    hour of a trajectory, in one pass."""
    keep = (st.time <= end + 1e-6) & (st.time >= -1e-6)
    if spec.neutralised.size:
        keep &= ~np.isin(st.channel, spec.neutralised)
    if st.locate is _long_loc:  # rows named ["observations", row]: the rows are the sources
        return tuple(st.source[keep].tolist()), tuple(st.time[keep].tolist())
    pairs = [(int(loc[1]), t) for loc, t in zip(
        (st.locate(int(r)) for r in st.source[keep].tolist()), st.time[keep].tolist(),
        strict=True) if len(loc) > 1 and loc[0] == "observations" and isinstance(loc[1], int)]
    return tuple(r for r, _ in pairs), tuple(t for _, t in pairs)


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


def _screened(spec: ModelSpec, x: np.ndarray, unobserved: np.ndarray, lengths: np.ndarray,
              observed: list[np.ndarray], notices: list[list[Notice]]) -> list[np.ndarray]:
    """Per stay, the observed channels its explanation screen picks for exact occlusion, and a
    notice on each stay where it left some out (its contributions are then screened)."""
    assert spec.screen is not None
    coefficients, m = spec.screen
    out = []
    for s, chans in enumerate(observed):
        picked = candidates(x[s], unobserved[s], int(lengths[s]), chans, spec.fs,
                            coefficients, m)
        if len(picked) < len(chans):
            notices[s].append(Notice(
                code=SCREENED_NOTICE,
                message=f"contributions were computed exactly for the {len(picked)} of "
                f"{len(chans)} observed channels the model's explanation screen ranked "
                "highest; explain=full computes every channel's"))
        out.append(picked)
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


def data_end(stay: Stay, times: np.ndarray) -> float:
    """Hours from admission to the end of the stay's data so far: its `end_hours` when given,
    else its last observation (a trajectory ends there, even inside a fixed window)."""
    if stay.end_hours is not None:
        return float(stay.end_hours)
    return float(times.max()) if len(times) else 0.0


def prepare(spec: ModelSpec, stays: list[Stay], *, strict: bool = False,
            max_observations: int = DEFAULT_MAX_OBSERVATIONS,
            occlusion: bool = False, screened: bool = False) -> PreparedStays:
    """Validate, clean, neutralise and tensorize; problems and notices are kept per stay.

    `occlusion` adds one occlusion variant per observed channel of each stay, from which
    contributions are read (`scehr.service.explain.Level.occlusion`); `screened` only for the
    channels the model's explanation screen picks, when it has one (`Level.screened`)."""
    res = ingest(stays, spec.fs, strict=strict, max_observations=max_observations)
    notices = [list(s.notices) for s in res.stays]
    problems = {i: s.problems for i, s in enumerate(res.stays) if s.problems}
    prep = PreparedStays(len(stays), res.ok, problems, notices, [s.id for s in stays])
    if not res.ok:
        return prep
    obs = _neutralise(spec, res.observations, res.ok, notices)
    prep.data = summarize(obs, res.end_hours, spec.fs)
    prep.observations = obs
    prep.data_end = [data_end(stays[i], res.stays[i].time) for i in res.ok]
    prep.rows = [partial(_rows_read, spec, res.stays[i], float(res.end_hours[j]))
                 for j, i in enumerate(res.ok)]
    prep.rows_at = [partial(_rows_read_at, spec, res.stays[i], float(res.end_hours[j]))
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
    if occlusion:
        prep.occluded = _observed_channels(obs, n, res.end_hours)
        nothing = Observations(np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0), n)
        unobserved = spec.normalizer.transform(*_tensor(spec, nothing, res.end_hours))
        if screened and spec.screen is not None:
            prep.occluded = _screened(spec, x, unobserved, lengths, prep.occluded,
                                      [notices[i] for i in res.ok])
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
