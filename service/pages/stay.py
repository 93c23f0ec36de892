"""The stay page's scoring route: a JSON stay or a FHIR Bundle in, an HTML fragment out.

`POST /ui/stay/{task}` is a scoring route like `POST /predict/{task}`: registered by
`add_scoring_route`, so the API key, the media types, load shedding, the deadline, the scorer,
monitoring and the audit line are the API's own. It decodes the body as `/predict/{task}` does
(or, for a Bundle, as `/fhir/predict/{task}` does) and answers the same `Prediction`, drawn
as HTML: the risk with its interval and alert, or the abstention and its reasons; the
explanation; the contributions; and the stay's own series after the cleaning rules, marking
the values they dropped or clipped. Errors are the API's `ErrorBody` JSON, which the page's
script lists (field, rule, allowed values).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fastapi.responses import HTMLResponse, Response
from markupsafe import Markup

from scehr.schemas.featureset import FeatureSet
from scehr.schemas.ingest import ColumnStay, RowError, _hours_of, ingest_stay
from scehr.schemas.payloads import Notice, Prediction, StayPayload
from scehr.schemas.tasks import landmark_task
from scehr.service.interfaces.base import Call, Codec, Decoded, body_loc, one_prediction
from scehr.service.interfaces.fhir import FHIR_BYTE_COST, read_body, reject_xml
from scehr.service.interfaces.json_single import parse_stay
from scehr.service.interop.fhir_in import read_bundle
from scehr.service.interop.fhir_limits import FhirLimits
from scehr.service.interop.fhir_out import FHIR_JSON
from scehr.service.media_types import JSON
from scehr.service.pages.render import page, render
from scehr.service.pages.svg import (
    PALETTE,
    Axes,
    Mark,
    Series,
    bar_chart,
    line_chart,
    nice_ticks,
    risk_scale,
)
from scehr.service.registry import Registry
from scehr.service.scorer import ScoredStays

#: Contributions drawn per class (the largest by size; the response lists all).
MAX_BARS = 15
#: Notices whose rows the series mark: values the cleaning rules removed, values they clipped.
DROPPED = ("value_dropped", "value_implausible")
CLIPPED = ("value_clipped",)


@dataclass
class Panel:
    """One variable's series in the small multiples."""

    variable: str
    unit: str
    points: list[tuple[float, float]] = field(default_factory=list)
    clipped: list[tuple[float, float]] = field(default_factory=list)
    dropped: list[float] = field(default_factory=list)  # hours of removed values
    figure: Markup | None = None


def is_bundle(raw: bytes) -> bool:
    """Whether a body is a FHIR Bundle (a JSON object whose resourceType says so)."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return isinstance(body, dict) and body.get("resourceType") == "Bundle"


def _row(loc: list[str | int] | None) -> tuple[str | int, ...] | None:
    """A notice's row: its field path up to the row (the value's own field left off)."""
    if not loc:
        return None
    head = loc[:2] if loc[0] == "observations" else loc[:4]
    return tuple(head)


def row_hours(stay: StayPayload | ColumnStay, row: tuple[str | int, ...]) -> float | None:
    """The hour of a payload row (for a value the cleaning removed), by the time rule."""
    try:
        if isinstance(stay, ColumnStay) and row[0] == "observations":
            cols = stay.columns
            return _hours_of(cols.time[int(row[1])], cols.admission)
        if isinstance(stay, StayPayload) and row[0] == "observations" and stay.observations:
            return _hours_of(stay.observations[int(row[1])].time, stay.admission_time)
        if isinstance(stay, StayPayload) and row[0] == "wide" and stay.wide is not None:
            return float(stay.wide.hours[int(row[3])])
    except (IndexError, ValueError, TypeError, RowError):
        return None
    return None


def panels(stay: StayPayload | ColumnStay, fs: FeatureSet, notices: list[Notice],
           max_observations: int) -> list[Panel]:
    """The stay's observed series in canonical units after the cleaning rules (ingest's own
    rules, run again on the decoded stay), with the rows its notices name."""
    got = ingest_stay(stay, fs, max_observations=max_observations)
    flagged = {_row(n.loc): n.code for n in notices if n.code in DROPPED + CLIPPED}
    out: dict[int, Panel] = {}
    locs = got.loc
    for k, ch in enumerate(got.channel.tolist()):
        var = fs.variables[ch]
        p = out.setdefault(ch, Panel(var.id, var.unit or ""))
        pt = (float(got.time[k]), float(got.value[k]))
        p.points.append(pt)
        if flagged.get(_row(locs[k])) in CLIPPED:
            p.clipped.append(pt)
    ids = {v.id: ch for ch, v in enumerate(fs.variables)}
    for n in notices:
        row = _row(n.loc)
        if n.code in DROPPED and n.variable in ids and row is not None:
            ch = ids[n.variable]
            hours = row_hours(stay, row)
            p = out.setdefault(ch, Panel(n.variable, fs.variables[ch].unit or ""))
            if hours is not None:
                p.dropped.append(hours)
    return [out[ch] for ch in sorted(out)]


def draw_panel(p: Panel, k: int, hours: float) -> Markup:
    """A small multiple: the series, clipped values as triangles, removed ones as crosses
    on the time axis."""
    ys = [y for _, y in p.points]
    lo, hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
    if hi <= lo:
        lo, hi = lo - 1.0, hi + 1.0
    pad = (hi - lo) * 0.08
    ax = Axes(0.0, hours, lo - pad, hi + pad, width=230, height=110, left=40, right=8,
              top=6, bottom=20, x_ticks=nice_ticks(0, hours, 4),
              y_ticks=nice_ticks(lo, hi, 3))
    marks = [Mark(x, y, f"clipped to {y:g} at {x:g} h", PALETTE[1], "triangle")
             for x, y in p.clipped]
    marks += [Mark(x, lo - pad, f"value removed at {x:g} h", PALETTE[1], "cross")
              for x in p.dropped]
    desc = (f"{len(p.points)} values of {p.variable} ({p.unit}) from {lo:g} to {hi:g}"
            + (f"; {len(p.clipped)} clipped" if p.clipped else "")
            + (f"; {len(p.dropped)} removed by the cleaning rules" if p.dropped else ""))
    return line_chart(f"series-{k}", f"{p.variable} ({p.unit})" if p.unit else p.variable,
                      desc, ax, [Series(p.variable, p.points, PALETTE[0], marker=True)],
                      marks, legend=False)


def landmark_served(registry: Registry, task: str) -> tuple[str | None, str]:
    """The landmark task whose model gives `task`'s risk at every hour here, or None and the
    one line the stay page says instead."""
    landmark = landmark_task(task)
    if landmark is None:
        return None, f"no landmark task gives the {task} risk at every hour."
    if landmark not in registry.handles:
        return None, f"no {landmark} model is served here."
    return landmark, ""


def result_figures(pred: Prediction) -> list[dict[str, Any]]:
    """Per class: the risk scale and the contributions chart."""
    out = []
    for k, r in enumerate(pred.results):
        iv = r.risk_interval
        op = r.operating_point
        scale = risk_scale(f"risk-{k}", r.risk, iv and iv.low, iv and iv.high,
                           op.threshold if op.applies_to == "risk" else None, op.name)
        bars = None
        if r.contributions:
            top = sorted(r.contributions, key=lambda c: -abs(c.delta))[:MAX_BARS]
            bars = bar_chart(f"contrib-{k}", f"What moved the risk of {r.label}",
                             "Risk change when each variable is left out (positive: it raises "
                             "the risk): " + "; ".join(f"{c.variable} {c.delta:+.3f}"
                                                       for c in top),
                             [(c.variable, c.delta) for c in top], unit="Δ risk")
        out.append({"result": r, "scale": scale, "bars": bars,
                    "shown": min(MAX_BARS, len(r.contributions or []))})
    return out


def stay_fragment(pred: Prediction, stay: StayPayload | ColumnStay, fs: FeatureSet,
                  max_observations: int, source: str, trajectory: tuple[str | None, str] = (
                      None, "no landmark model is served here.")) -> str:
    """The HTML fragment of one scored (or abstained) stay; `trajectory`: the landmark task
    whose risk over time the page asks for next, or None and the line said instead."""
    ps = panels(stay, fs, pred.warnings, max_observations)
    hours = float(fs.window_hours or max([x for p in ps for x, _ in p.points], default=48.0))
    for k, p in enumerate(ps):
        p.figure = draw_panel(p, k, hours)
    return render("stay_result.html", pred=pred, figures=result_figures(pred), panels=ps,
                  source=source, trajectory=trajectory[0], no_trajectory=trajectory[1])


class PageStay(Codec):
    """The stay page's codec (see the module's docstring)."""

    path = "/ui/stay/{task}"
    name = "ui_stay"
    route: ClassVar[Mapping[str, Any]] = {
        "response_class": HTMLResponse, "include_in_schema": False,
        "openapi_extra": {"requestBody": {"required": True, "content": {
            JSON: {"schema": {"type": "object"}},
            FHIR_JSON: {"schema": {"type": "object"}}}}}}
    defaults: ClassVar[Mapping[str, Any]] = {"explain": "full"}
    byte_cost = FHIR_BYTE_COST

    def decode(self, call: Call) -> Decoded:
        reject_xml(call.raw)
        if not is_bundle(call.raw):
            return Decoded([parse_stay(call.raw)], context=("JSON stay", body_loc))
        bundle = read_body(call.raw, FhirLimits(call.settings.max_observations))
        stay = read_bundle(bundle, variables=call.spec.fs.variables,
                           full=call.settings.fhir_validation == "full")
        return Decoded([stay.payload], context=("FHIR Bundle", stay.locate))

    def encode(self, call: Call, decoded: Decoded, scored: ScoredStays | None) -> Response:
        source, locate = decoded.context
        pred, _ = one_prediction(scored, locate)
        html = stay_fragment(pred, decoded.stays[0], call.spec.fs,
                             call.settings.max_observations, source,
                             landmark_served(call.request.app.state.registry, call.task))
        return page(html)
