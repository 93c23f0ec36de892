"""The stay page's risk over time: a landmark model's risk at every hour, drawn.

`POST /ui/stay/{task}/trajectory` is the trajectory route (`POST /predict/{task}/trajectory`)
answering HTML: the same codec base (`_PerHour`: the landmark task of the outcome, its handle,
the per-hour scoring), the stay page's decoding (a JSON stay or a FHIR Bundle), and the
`TrajectoryPrediction` drawn as a line with its interval band, the abstained hours shaded and
the policy's alert events marked, with the hours as a table. The stay page asks for it after
the stay's risk, only where a landmark model of the task is served
(`stay.landmark_served`).
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import groupby
from typing import Any, ClassVar

from fastapi.responses import Response
from markupsafe import Markup

from scehr.schemas.trajectory_payloads import TrajectoryHour, TrajectoryPrediction
from scehr.service.interfaces.base import Call, Decoded, one_trajectory
from scehr.service.interfaces.trajectory import _PerHour
from scehr.service.pages.render import page, render
from scehr.service.pages.stay import PageStay
from scehr.service.pages.svg import (
    PALETTE,
    Axes,
    Mark,
    Series,
    band,
    hline,
    line_chart,
    nice_ticks,
    span,
)
from scehr.service.scorer import ScoredStays

#: Interval band, abstained hours: light tints of the palette's blue and grey.
BAND, ABSTAINED = "#c9d9ea", "#ececec"


def abstained_runs(hours: list[TrajectoryHour]) -> list[dict[str, Any]]:
    """Consecutive abstained hours with the same first reason: from, to, code, message."""
    out = []
    for (status, code), group in groupby(
            hours, key=lambda h: (h.status, h.reasons[0].code if h.reasons else None)):
        run = list(group)
        if status == "abstained":
            out.append({"from": run[0].hour, "to": run[-1].hour, "code": code,
                        "message": run[0].reasons[0].message if run[0].reasons else ""})
    return out


#: Tops the risk axis may have: the first at or above the highest figure drawn.
AXIS_TOPS = (0.1, 0.2, 0.3, 0.5, 0.75, 1.0)


def _top(traj: TrajectoryPrediction) -> float:
    """The risk axis' top: room for the highest interval bound, risk and the threshold."""
    highs = [h.interval.high if h.interval else h.risk for h in traj.hours if h.risk is not None]
    need = max([*highs, traj.alert_policy.threshold])
    return next(t for t in AXIS_TOPS if t >= min(need * 1.1, 1.0))


def trajectory_chart(traj: TrajectoryPrediction, ident: str = "trajectory-chart") -> Markup:
    """The risk at each scored hour as a line (broken where hours abstain), its interval as a
    band, abstained hours as grey columns, the alert threshold dashed, alert events as red
    triangles."""
    hours = traj.hours
    last = max([h.hour for h in hours], default=1)
    top = _top(traj)
    ax = Axes(0, max(last, 1) + 0.5, 0, top, width=720, height=280,
              x_ticks=nice_ticks(0, last, 9), y_ticks=nice_ticks(0, top, 5),
              x_label="hours since admission (the risk from the data up to each hour)",
              y_label="risk")
    layers = [span(ax, r["from"] - 0.5, r["to"] + 0.5, ABSTAINED,
                   f"no risk at hours {r['from']}-{r['to']}: {r['message']}")
              for r in abstained_runs(hours)]
    series = []
    for scored, group in groupby(hours, key=lambda h: h.status == "scored"):
        run = list(group)
        if not scored:
            continue
        with_iv = [(h.hour, h.interval.low, h.interval.high) for h in run if h.interval]
        if with_iv:
            layers.append(band(ax, with_iv, BAND, f"interval, hours {run[0].hour}-"
                               f"{run[-1].hour}"))
        series.append(Series(f"risk, hours {run[0].hour}-{run[-1].hour}",
                             [(h.hour, h.risk) for h in run if h.risk is not None],
                             PALETTE[0], marker=True))
    policy = traj.alert_policy
    layers.append(hline(ax, policy.threshold, PALETTE[1],
                        f"alert threshold {policy.threshold:.3f}"))
    marks = [Mark(a.hour, a.risk, f"alert at hour {a.hour}, risk {a.risk:.3f}", PALETTE[1],
                  "triangle") for a in traj.alerts]
    scored = [h for h in hours if h.risk is not None]
    desc = (f"The {traj.label} risk at {len(scored)} of {len(hours)} hours"
            + (f", from {min(h.risk for h in scored):.3f} to {max(h.risk for h in scored):.3f}"
               if scored else "")
            + "; no risk at hours " + (", ".join(f"{r['from']}-{r['to']} ({r['code']})"
                                               for r in abstained_runs(hours)) or "none")
            + f"; alert threshold {policy.threshold:.3f}; alerts at hours "
            + (", ".join(str(a.hour) for a in traj.alerts) or "none") + ".")
    return line_chart(ident, f"The {traj.label} risk over time", desc, ax, series, marks,
                      legend=False, layers=layers)


class PageTrajectory(_PerHour, PageStay):
    """The stay page's risk over time (see the module's docstring)."""

    path = "/ui/stay/{task}/trajectory"
    name = "ui_stay_trajectory"
    defaults: ClassVar[Mapping[str, Any]] = {}

    def encode(self, call: Call, decoded: Decoded, scored: ScoredStays | None) -> Response:
        _, locate = decoded.context
        traj, _ = one_trajectory(scored, locate)
        return page(render("trajectory_result.html", traj=traj,
                           chart=trajectory_chart(traj), runs=abstained_runs(traj.hours)))
