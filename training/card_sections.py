"""Model-card sections for what the model will not answer or cannot be sure of: withheld
points, levels, data minimum, the uncertainty served with each risk."""

from __future__ import annotations

from scehr.schemas.manifest import Interval, Manifest
from scehr.schemas.site import site_record
from scehr.schemas.uncertainty import LEVELS, RiskUncertainty
from scehr.training.uncertainty import COVERAGE_SLACK, MIN_SINGLE


def withheld_lines(m: Manifest) -> list[str]:
    """Per class: the points it does not serve and why, and its warning/critical levels."""
    rows = [(c.label, w.name, w.reason) for c in m.classes for w in c.withheld_points]
    levels = [(c.label, c.levels.warning, c.levels.critical or "none")
              for c in m.classes if c.levels is not None]
    out: list[str] = []
    if rows:
        out += _table("Operating points withheld",
                      "A class gets no alert at a point its validation data cannot support; a "
                      "request naming that point gets, for that class, no alert and this reason.",
                      ("class", "point", "reason"), rows)
    if levels:
        out += _table("Levels (on the risk)",
                      "`warning` from the first point's threshold, `critical` from the second's; "
                      "`info` below (CDS Hooks card indicator, FHIR qualitative risk).",
                      ("class", "warning at", "critical at"), levels)
    return out


def _table(title: str, intro: str, header: tuple[str, ...], rows: list) -> list[str]:
    """A card section: a heading, one paragraph, and a Markdown table of `rows`."""
    return ["", f"## {title}", "", intro, "", "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header), *("| " + " | ".join(map(str, r)) + " |" for r in rows)]


def data_minimum_lines(m: Manifest) -> list[str]:
    """The least data a stay needs, the rule that chose it, and its validation/test figures."""
    d = m.data_minimum
    if d is None:
        return ["", "## Data minimum", "", "None declared: only a stay without any "
                "observation is refused."]
    out = ["", "## Data minimum", "",
           "Below it the service gives no risk and no alert but the status `insufficient_data` "
           "with the reasons (research use: `?allow_insufficient=true`). Only observations "
           "inside the window count; the ICU type and height do not.", "",
           f"- at least {d.min_observations} observations and {d.min_channels} different "
           "variables in the window",
           f"- observations spanning at least {d.min_hours_covered:g} h",
           ]
    if d.max_hours_since_last is not None:
        out.append(f"- the last one within {d.max_hours_since_last:g} h of the window's end")
    # a multi-label model's study pools its classes: micro-AUROC, ECE over stay x class risks
    auroc, ece = ("micro-AUROC", "micro-ECE") if len(m.classes) > 1 else ("AUROC", "ECE")
    out += [f"- chosen by: {d.rule}", "",
            f"| split | stays | kept | {auroc} kept | {ece} kept | {auroc} all | outcome rate "
            "kept | outcome rate below minimum |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, f in (("validation", d.validation), ("test", d.test)):
        if f is not None:
            cells = (f.auroc, f.ece, f.auroc_all, f.outcome_rate_kept, f.outcome_rate_abstained)
            out.append(f"| {name} | {f.n} | {f.kept} | "
                       + " | ".join("—" if v is None else f"{v}" for v in cells) + " |")
    return out


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.1%}"


def uncertainty_lines(m: Manifest) -> list[str]:
    """The uncertainty served with each risk, its level and its measured coverage."""
    maps = [(c.label, c.uncertainty) for c in m.classes if c.uncertainty is not None]
    if not maps:
        return ["", "## Uncertainty", "", "This version serves no uncertainty interval "
                "(`risk_interval` is null)."]
    rows = []
    for label, u in maps:
        for check in (u.validation, u.test):
            if check is not None:
                rows.append((label, f"{u.level:.0%}", f"{u.n} ({u.positives})", check.split,
                             check.n, _pct(check.coverage), _pct(check.coverage_with_outcome),
                             _pct(check.coverage_without_outcome), _pct(check.single_outcome),
                             f"{check.mean_width:.3f}"))
    return _table(
        "Uncertainty",
        "Each risk is served with a Venn-Abers interval [low, high] and a conformal outcome "
        "set at the level below (docs/method.md, \"Uncertainty\"), fitted on the held-out "
        f"stays in the third column ({maps[0][1].fitted_on}). Coverage: the share of stays "
        "whose true outcome is in their set (nominal: the level, also given each outcome); "
        "single: stays whose set names one outcome; width: mean high - low.",
        ("class", "level", "held out (with outcome)", "split", "stays", "coverage",
         "with outcome", "without", "single", "width"), rows) + pooled_coverage_lines(maps)


def _ci(i: Interval | None, pct: bool = False) -> str:
    if i is None or i.value is None:
        return "n/a"
    f = (lambda x: f"{100 * x:.1f} %") if pct else (lambda x: f"{x:.3f}")
    return f(i.value) + (f" [{f(i.low)}, {f(i.high)}]" if i.low is not None and
                         i.high is not None else "")


def site_lines(m: Manifest) -> list[str]:
    """A site model's own figures (held-out site stays) beside its parent's on the same
    stays, where they come from, and what changed; empty for any other model."""
    site = site_record(m.metrics)
    if site is None:
        return []
    p, fig, was = site.provenance, site.figures, site.parent_figures
    rows = [("stays scored (with the outcome)", f"{was.scored} ({was.positives})",
             f"{fig.scored} ({fig.positives})"),
            ("abstention rate", _ci(was.abstention_rate, True), _ci(fig.abstention_rate, True)),
            ("AUROC", _ci(was.auroc), _ci(fig.auroc)), ("AUPRC", _ci(was.auprc), _ci(fig.auprc)),
            ("ECE", _ci(was.ece), _ci(fig.ece))]
    if fig.level is not None:
        rows += [(f"{fig.level:.0%} outcome sets: coverage", _ci(was.coverage, True),
                  _ci(fig.coverage, True)),
                 ("coverage, stays with the outcome", _ci(was.coverage_with_outcome, True),
                  _ci(fig.coverage_with_outcome, True)),
                 ("coverage, stays without", _ci(was.coverage_without_outcome, True),
                  _ci(fig.coverage_without_outcome, True))]
    for name in dict.fromkeys([*was.alert_rates, *fig.alert_rates]):
        rows.append((f"alert rate `{name}`", _ci(was.alert_rates.get(name), True),
                     _ci(fig.alert_rates.get(name), True) if name in fig.alert_rates
                     else "withheld"))
    s = p.split
    out = _table("Site figures (95% bootstrap CI)",
                 f"A site model: {p.parent} recalibrated on {p.data} (sha256 of its stays as "
                 f"the model reads them: `{p.data_sha256[:16]}...`; {p.stays} stays, "
                 f"{p.positives} with the outcome, {p.below_minimum} below the data minimum). "
                 f"{s.rule} (seed {s.seed}; `{s.file}` lists each stay's part): the "
                 f"calibration map, uncertainty map and operating points were fitted on "
                 f"{s.fit.scored} stays of the fitting part that meet the data minimum "
                 f"({s.fit.scored_positives} with the outcome); the figures below are on "
                 f"{fig.on}, for this model and for its parent as shipped. In the operating-"
                 "point table, `val` is the site's fitting part and `test` its held-out part.",
                 ("figure", "parent, as shipped", "this site model"), rows)
    out += ["", "What changed against the parent:", ""] + [f"- {c}" for c in site.changes]
    return out


def pooled_coverage_lines(maps: list[tuple[str, RiskUncertainty]]) -> list[str]:
    """For a multi-class model: coverage per served level, pooled over its classes (every stay
    x class pair), on validation and test; and the levels validation did not support."""
    if len(maps) < 2:
        return []
    out = ["", "Pooled over the classes served at each level (every stay and class):", ""]
    for level in sorted({u.level for _, u in maps}, reverse=True):
        at = [u for _, u in maps if u.level == level]
        cells = []
        for split in ("validation", "test"):
            checks = [getattr(u, split) for u in at if getattr(u, split) is not None]
            n = sum(c.n for c in checks)
            if n:
                cells.append(f"{split} {sum(c.coverage * c.n for c in checks) / n:.1%}")
        out.append(f"- {level:.0%} ({len(at)} of {len(maps)} classes): " + ", ".join(cells))
    top = max(LEVELS)
    if all(u.level < top for _, u in maps):
        out += ["", f"No class is served at {top:.0%} or at any level above "
                f"{max(u.level for _, u in maps):.0%}: a level is served only where the "
                f"validation stays reach it (one-outcome sets for {MIN_SINGLE:.0%} of them, "
                f"coverage at most {COVERAGE_SLACK:.0%} below the level, overall and given "
                "the outcome; `scehr.training.uncertainty.level_holds`), else the lowest."]
    return out
