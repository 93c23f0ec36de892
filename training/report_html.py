"""report.html of an evaluation report: one self-contained page (inline CSS, figures as
base64 PNG, no script, no link to fetch), so it opens offline and can be mailed or archived."""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable
from pathlib import Path
from typing import Any

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:2em auto;
max-width:1100px;color:#222;line-height:1.45;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;
margin-top:1.8em}table{border-collapse:collapse;margin:.6em 0 1em;font-size:.92em}
th,td{border:1px solid #d0d0d0;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums;
white-space:nowrap}.ci{font-size:.85em;color:#666}
.meta td{border:none;padding:.1em .8em .1em 0}.warn{background:#fff4d6;border:1px solid #e0b84c;
padding:.6em 1em;border-radius:4px}.warn li{margin:.2em 0}.na{color:#a15c00;font-style:italic}
figure{display:inline-block;width:48%;margin:.5em 1% 1em 0;vertical-align:top}
figure img{width:100%;border:1px solid #eee}figcaption{font-size:.88em;color:#444;
max-width:620px}code{background:#f4f4f4;padding:0 .25em}.small{font-size:.88em;color:#555}
"""

#: The figures in the order shown, with what each shows.
FIGURES = {
    "reliability": "Observed outcome rate against the mean served risk, in equal-count risk "
                   "groups of the scored stays; the band is the 95 % (Wilson) interval of each "
                   "group's observed rate. On the diagonal: risks mean what they say.",
    "roc": "ROC curves: the scored stays, all stays with the data minimum lifted, and the "
           "compared model's scored stays.",
    "pr": "Precision-recall curves of the same stays; the dashed line is the outcome rate.",
    "risk_by_outcome": "Served risk of the scored stays with and without the outcome (each "
                       "group sums to 1), with the named operating points.",
    "coverage_by_decile": "Share of scored stays whose true outcome is in their served outcome "
                          "set, per decile of risk; triangles: among the stays with the "
                          "outcome. The dashed line is the nominal level.",
    "alert_rates": "Alert rate, sensitivity and PPV at each named operating point on the "
                   "scored stays, with 95 % bootstrap intervals.",
}

METRIC_NAMES = {
    "auroc": "AUROC", "auprc": "AUPRC", "ece": "expected calibration error (ECE)",
    "calibration_slope": "calibration slope (ideal 1)",
    "calibration_intercept": "calibration intercept (ideal 0)",
    "event1_best_threshold": "Event 1 at its best threshold (Challenge 2012)",
    "event2_h_normalized": "Event 2: Hosmer-Lemeshow H, normalised",
    "event2_h": "Hosmer-Lemeshow H",
}


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def pct(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{100 * x:.{digits}f} %"


def ci_cell(ci: dict[str, Any] | None, digits: int = 3, percent: bool = False) -> str:
    """A table cell: the value, its 95 % interval under it; a figure that cannot be estimated
    says why instead."""
    if not ci or (ci.get("value") is None and not ci.get("warning")):
        return "<td class=num>n/a</td>"
    if ci.get("warning"):
        return f"<td class=na>{esc(ci['warning'])}</td>"

    def num(v: float) -> str:
        return pct(v) if percent else f"{v:.{digits}f}"

    interval = ("" if ci.get("low") is None else
                f"<br><span class=ci>[{esc(num(ci['low']))}, {esc(num(ci['high']))}]</span>")
    note = f" title='{esc(ci['note'])}'" if ci.get("note") else ""
    return f"<td class=num{note}>{esc(num(ci['value']))}{' *' if note else ''}{interval}</td>"


def table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    """Rows of ready cells (`<td>...`) under a header of plain text."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def td(x: Any, num: bool = False) -> str:
    return f"<td{' class=num' if num else ''}>{esc(x)}</td>"


def _columns(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(model role, population, header) of each figure column."""
    out = []
    for role, block in report["models"].items():
        v = block["model"]["version"]
        a = block["abstention"]
        out.append((role, "scored", f"{v}: scored stays (n={a['scored']})"))
        out.append((role, "all", f"{v}: all stays, minimum lifted "
                    f"(n={block['all']['metrics']['n']})"))
    return out


def summary_section(report: dict[str, Any]) -> str:
    rows = []
    for block in report["models"].values():
        a, m = block["abstention"], block["model"]
        sc = block["scored"]
        cov = sc["coverage"]
        default = next((p for p in sc["operating_points"] if p["default"]), None)
        rows.append([
            f"<td><b>{esc(m['version'])}</b><br><span class=ci>{esc(m['name'])}</span></td>",
            ci_cell(a["rate"], percent=True) if a["data_minimum"] is not None
            else td("no data minimum"),
            ci_cell(sc["metrics"].get("auroc")), ci_cell(block["all"]["metrics"].get("auroc")),
            ci_cell(sc["metrics"].get("ece")),
            ci_cell(cov["overall"], percent=True) if cov else td("no interval"),
            ci_cell(cov["with_outcome"], percent=True) if cov else td("no interval"),
            ci_cell(default["alert_rate"], percent=True) if default else td("n/a")])
    return "<h2>At a glance</h2>" + table(
        ["model", "abstained (below the data minimum)", "AUROC, scored stays",
         "AUROC, all stays (minimum lifted)", "ECE, scored stays", "interval coverage",
         "coverage, stays with the outcome", "alert rate at the default point"], rows)


def abstention_section(report: dict[str, Any]) -> str:
    parts = ["<h2>Abstention: stays below the data minimum</h2>"]
    for block in report["models"].values():
        a, m = block["abstention"], block["model"]
        dm = a["data_minimum"]
        if dm is None:
            parts.append(f"<p><b>{esc(m['version'])}</b> declares no data minimum: it scores "
                         "every stay.</p>")
            continue
        bound = (f"at least {dm['min_observations']} observations and "
                 f"{dm['min_channels']} variables in the window"
                 + (f", spanning at least {dm['min_hours_covered']:g} h"
                    if dm.get("min_hours_covered") else "")
                 + (f", the last within {dm['max_hours_since_last']:g} h of its end"
                    if dm.get("max_hours_since_last") is not None else ""))
        ref = a.get("rate_on_the_models_test_set")
        parts.append(
            f"<p><b>{esc(m['version'])}</b> needs {esc(bound)}. {a['abstained']} of {a['n']} "
            f"stays fall below it ({esc(pct(a['rate']['value']))}"
            + (f"; {esc(pct(ref))} on the model's own test set" if ref is not None else "")
            + f"). Outcome rate: {esc(pct(a['outcome_rate_scored']))} among the scored stays, "
            f"{esc(pct(a['outcome_rate_abstained']))} among those below the minimum.</p>")
        if a["reasons"]:
            parts.append(table(["the service's reason (N: the stay's own figure; a stay can "
                                "miss several bounds)", "stays"],
                               [[td(r["reason"]), td(r["stays"], True)] for r in a["reasons"]]))
    return "".join(parts)


def metrics_section(report: dict[str, Any]) -> str:
    cols = _columns(report)
    first = report["models"]["model"]["scored"]["metrics"]
    names = [k for k in METRIC_NAMES if k in first]
    rows = [[td("stays (with the outcome)")] + [
        td(f"{report['models'][r][p]['metrics']['n']} "
           f"({report['models'][r][p]['metrics']['events']})", True) for r, p, _ in cols]]
    for k in names:
        digits = 2 if k.startswith("event2") else 3
        rows.append([td(METRIC_NAMES[k])] + [
            ci_cell(report["models"][r][p]["metrics"].get(k), digits) for r, p, _ in cols])
    return ("<h2>Discrimination and calibration</h2><p>On the stays the service scores, and on "
            "all stays with the data minimum lifted (what the model would say if it did not "
            "abstain). Calibration slope &lt; 1: risks too extreme; intercept &gt; 0: risks too "
            "low. A slope or intercept needs at least 10 stays of each outcome and a fit that "
            "converges; where not, it says why instead of giving a number.</p>"
            + table(["figure", *(h for _, _, h in cols)], rows))


def coverage_section(report: dict[str, Any]) -> str:
    cols = [(r, p, h) for r, p, h in _columns(report) if report["models"][r][p]["coverage"]]
    if not cols:
        return ("<h2>Risk intervals</h2><p>No model here serves a risk interval: coverage "
                "cannot be reported.</p>")
    level = report["models"][cols[0][0]][cols[0][1]]["coverage"]["level"]
    keys = [("overall", "all stays"), ("with_outcome", "stays with the outcome"),
            ("without_outcome", "stays without it")]
    rows = [[td(f"coverage: {label}")] + [
        ci_cell(report["models"][r][p]["coverage"][k], percent=True) for r, p, _ in cols]
        for k, label in keys]
    rows.append([td("one-outcome sets")] + [
        td(pct(report["models"][r][p]["coverage"]["single_outcome_share"]), True)
        for r, p, _ in cols])
    rows.append([td("coverage on the model's validation split")] + [
        td(pct(report["models"][r][p]["coverage"]["validation_coverage"]), True)
        for r, p, _ in cols])
    return (f"<h2>Risk intervals</h2><p>The share of stays whose true outcome is in the "
            f"outcome set the service serves (nominal level {esc(pct(level, 0))}, per "
            "outcome by construction on the data the map was fitted on).</p>"
            + table(["figure", *(h for _, _, h in cols)], rows))


def points_section(report: dict[str, Any]) -> str:
    parts = ["<h2>Operating points</h2>"]
    for block in report["models"].values():
        m = block["model"]
        rows = []
        all_points = {p["name"]: p for p in block["all"]["operating_points"]}
        for p in block["scored"]["operating_points"]:
            v = p["validation"] or {}
            t = "served alert" if p["threshold"] is None else f"risk >= {p['threshold']:.4f}"
            rows.append([
                td(p["name"] + (" (default)" if p["default"] else "")), td(t),
                ci_cell(p["alert_rate"], percent=True), ci_cell(p["sensitivity"], percent=True),
                ci_cell(p["ppv"], percent=True),
                ci_cell(all_points.get(p["name"], {}).get("alert_rate"), percent=True),
                td(pct(v.get("alert_rate")), True), td(pct(v.get("ppv")), True)])
        for w in m["withheld_points"]:
            rows.append([td(w["name"]), f"<td class=na colspan=7>withheld: {esc(w['reason'])}"
                         "</td>"])
        parts.append(f"<p><b>{esc(m['name'])} {esc(m['version'])}</b></p>" + table(
            ["point", "alert when", "alert rate (scored)", "sensitivity (scored)",
             "PPV (scored)", "alert rate (all, minimum lifted)", "alert rate on validation",
             "PPV on validation"], rows))
    return "".join(parts)


def fairness_section(report: dict[str, Any]) -> str:
    f = report.get("site", {}).get("fairness")
    if not f:
        return ""
    rows = [[td(name), td(r["n"], True), td(r["deaths"], True),
             td("n/a" if r["auroc"] is None else f"{r['auroc']:.3f}", True),
             td("n/a" if r["calibration_slope"] is None else f"{r['calibration_slope']:.2f}",
                True),
             td("n/a" if r["calibration_intercept"] is None
                else f"{r['calibration_intercept']:.2f}", True),
             td(pct(r["alert_rate"]), True)] for name, r in f["groups"].items()]
    flip = f["sex_flip"]
    text = "" if not flip.get("n") else (
        f"<p>With only the recorded sex flipped, {flip['n']} stays move by a median "
        f"{flip['median']:.4f} (max {flip['max']:.4f}); {flip['alerts_changed']} alerts "
        "change.</p>")
    return (f"<h2>By sex and age band</h2><p class=small>On {esc(f['data'])}; alerts: "
            f"{esc(f['alert_rule'])}. n/a: too few stays of an outcome to estimate.</p>"
            + table(["group", "stays", "with the outcome", "AUROC", "calibration slope",
                     "calibration intercept", "alert rate"], rows) + text)


def figures_section(report: dict[str, Any], folder: Path) -> str:
    parts = ["<h2>Figures</h2>"]
    for name, caption in FIGURES.items():
        file = report.get("plots", {}).get(name)
        if not file or not (folder / file).is_file():
            continue
        data = base64.b64encode((folder / file).read_bytes()).decode()
        parts.append(f"<figure><img alt='{esc(name)}' src='data:image/png;base64,{data}'>"
                     f"<figcaption>{esc(caption)}</figcaption></figure>")
    return "".join(parts)


def render_html(report: dict[str, Any], folder: Path, title: str | None = None) -> str:
    """The page of `report`, its figures read from `folder` and inlined."""
    first = report["models"]["model"]["model"]
    title = title or (f"{first['task']} {first['version']} on "
                      f"{Path(report['data']['folder']).name}")
    d = report["data"]
    meta = [("data", f"{d['folder']}" + (f" ({d['source']})" if d.get("source") else "")),
            ("stays", f"{d['stays']} ({d['events']} with the outcome), split: {d['split']}"),
            ("how", report["how"]), ("made", report["created_at"])]
    if report.get("command"):
        meta.append(("command", report["command"]))
    warnings = "".join(f"<li>{esc(w)}</li>" for w in report["warnings"])
    site = report.get("site", {})
    channels = "".join(
        f"<p class=small>{esc(label)}: {esc(', '.join(site[key]))}</p>"
        for key, label in (("never_observed", "Never observed at this site"),
                           ("neutralised_channels", "Never seen in training, treated as not "
                                                    "observed"))
        if site.get(key))
    return "".join([
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1><table class=meta>",
        "".join(f"<tr><td><b>{esc(k)}</b></td><td>{esc(v)}</td></tr>" for k, v in meta),
        "</table>",
        f"<div class=warn><b>Read first</b><ul>{warnings}</ul></div>" if warnings else "",
        summary_section(report), abstention_section(report), metrics_section(report),
        coverage_section(report), points_section(report), fairness_section(report),
        figures_section(report, folder), channels,
        "<p class=small>Research software: not for clinical use without local validation."
        "</p></body></html>\n"])
