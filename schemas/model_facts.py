"""What a manifest says about its model, as sentences: the facts the transparency documents
(`scehr.schemas.transparency`: HTI-1 source attributes, CHAI applied model card, TRIPOD+AI)
and the model card share, each written once here so the documents cannot disagree.

A function returns None where the manifest records nothing on its subject; the documents then
say so and why, instead of inventing an answer.
"""

from __future__ import annotations

from typing import Any

from scehr.schemas.manifest import SERVED_RISK, Interval, Manifest
from scehr.schemas.site import PARENT_KEY, SiteFigures, site_record
from scehr.schemas.tasks import task_spec

#: Who the scores are for, and the part they play (the model card's "Intended use").
INTENDED_USERS = ("clinical-informatics teams evaluating risk scores, and researchers "
                  "reproducing SCEHR")
DECISION_ROLE = "Scores support review and triage; they are not diagnoses."
NOT_FOR_CLINICAL_USE = "Not for clinical use without local validation."
RESEARCH_ARTIFACT = "A research artifact of scehr."
RELEASE_STAGE = f"{NOT_FOR_CLINICAL_USE} {RESEARCH_ARTIFACT}"
DEVELOPER = "the scehr project (open-source software, MIT licence)"
#: The limitations every card lists after the model's own.
STANDARD_LIMITATIONS = (
    "Trained on one data source; performance elsewhere must be checked locally.",
    "The risk is the model's score after a calibration map fitted on held-out data; the raw "
    "score is not a probability to show a clinician.")
#: The demographic inputs a manifest's `static` block can hold, as HTI-1's variables name them.
STATIC_AS_DEMOGRAPHIC = {"age": "date of birth (read as age in years)", "sex_male": "sex"}
METHOD_REFERENCE = ("Zang C, Wang F. SCEHR: Supervised contrastive learning for clinical risk "
                    "prediction using electronic health records. arXiv:2110.04943 (2021)")


def ci(x: Interval | dict[str, Any] | None, digits: int = 3) -> str:
    """`value [low, high]`, or n/a."""
    d = x.model_dump() if isinstance(x, Interval) else (x or {})
    if d.get("value") is None:
        return "n/a"
    if d.get("low") is None:
        return f"{d['value']:.{digits}f}"
    return f"{d['value']:.{digits}f} [{d['low']:.{digits}f}, {d['high']:.{digits}f}]"


def num(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def output_value(m: Manifest) -> str:
    """What the model gives for a stay."""
    spec = task_spec(m.task)
    maps = sorted({c.calibration.method for c in m.classes})
    points = sorted({p.name for c in m.classes for p in c.named_points})
    per = "its outcome" if spec.binary else f"each of its {len(m.label_names)} labels"
    parts = [f"For a stay, a risk for {per} ({', '.join(m.label_names[:3])}"
             f"{', ...' if len(m.label_names) > 3 else ''}): the model's score after a "
             f"calibration map fitted on held-out stays ({', '.join(maps)})"]
    if any(c.uncertainty is not None for c in m.classes):
        parts.append("a Venn-Abers interval and a conformal outcome set around the risk")
    if points:
        parts.append("an alert when the risk reaches a named operating point ("
                     + ", ".join(points) + ")")
    parts.append("an explanation: the anchor margin against held-out stays' percentiles and "
                 "the nearest outcome prototypes")
    text = "; ".join(parts) + "."
    if m.data_minimum is not None:
        text += (" Below the data minimum it gives no risk but the status insufficient_data "
                 "with the reasons.")
    return text


def output_kind(m: Manifest) -> str:
    """HTI-1's type of output."""
    what = task_spec(m.task).description.rstrip(".")
    if task_spec(m.task).binary:
        return f"Prediction: the probability of {m.label_names[0]} ({what})"
    return f"Classification as probabilities: one per label, {len(m.label_names)} labels ({what})"


def intended_use(m: Manifest) -> str:
    return (f"Task `{m.task}`: {task_spec(m.task).description} {DECISION_ROLE} "
            f"{RELEASE_STAGE}")


def population(m: Manifest) -> str:
    """Who the model was made for: its training population, and the data a stay needs."""
    text = ("ICU stays like those it was trained on: "
            f"{m.provenance.description or m.provenance.dataset}")
    if m.data_minimum is not None:
        d = m.data_minimum
        text += (f" A stay is scored when it has at least {d.min_observations} observations of "
                 f"{d.min_channels} different variables spanning {d.min_hours_covered:g} h.")
    return text


def cautions(m: Manifest) -> str:
    """Tasks, situations and populations to avoid."""
    out = [RELEASE_STAGE, "Not for stays from a population or hospital unlike the training "
           f"data ({m.provenance.dataset}) until checked there (`scehr evaluate`), nor as a "
           "diagnosis."]
    if m.data_minimum is not None:
        out.append("Not for stays below the data minimum: the service abstains on them.")
    rare = m.metrics.get("too_rare_to_evaluate") or []
    if rare:
        out.append(f"The risks of {len(rare)} labels too rare in the test data to evaluate "
                   "(" + ", ".join(rare) + ") are not validated.")
    return " ".join(out)


def limitations(m: Manifest) -> str:
    never = [k for k, v in m.coverage.items() if v == 0.0]
    out = list(STANDARD_LIMITATIONS)
    if never:
        out.append("Variables never observed in training (" + ", ".join(never) + ") are "
                   "treated as not observed whatever a request sends.")
    withheld = [f"{c.label}: {w.name}" for c in m.classes for w in c.withheld_points]
    if withheld:
        out.append(f"{len(withheld)} named operating points are withheld for lack of "
                   "validation support (the model card lists why).")
    return " ".join(out)


def demographic_inputs(m: Manifest) -> list[str]:
    """The HTI-1 demographic variables the graph reads (empty: none)."""
    if not m.encoder.uses_static or m.static is None:
        return []
    return [STATIC_AS_DEMOGRAPHIC.get(f, f) for f in m.static.get("fields", [])]


def inputs(m: Manifest) -> str:
    fs = m.feature_set
    ids = [v["id"] for v in fs.get("variables", [])]
    window = (f"the first {fs['window_hours']:g} h" if fs.get("window_hours")
              else f"the whole stay (up to {fs.get('max_hours', 0):g} h)")
    static = demographic_inputs(m)
    return (f"{len(ids)} time series ({', '.join(ids)}) over {window} of the ICU stay, on a "
            f"{fs.get('timestep', 1):g} h grid, with observation masks (feature set "
            f"`{fs.get('name')}`, {fs.get('n_features')} features)"
            + (f", and {', '.join(static)}" if static else "; no demographic input") + ".")


def training_demographics(m: Manifest) -> str | None:
    """Age and sex of the training split (the static imputer's statistics), when recorded."""
    s = m.static
    if not s or "fields" not in s:
        return None
    means, stds = dict(zip(s["fields"], s["means"], strict=True)), dict(
        zip(s["fields"], s["stds"], strict=True))
    train = m.provenance.splits.get("train")
    parts = []
    if "age" in means:
        parts.append(f"mean age {means['age']:.1f} years (SD {stds['age']:.1f})")
    if "sex_male" in means:
        parts.append(f"{means['sex_male']:.1%} male")
    if not parts:
        return None
    return (f"Training split ({train.n if train else '?'} stays; a missing value counted at "
            "the training median): " + ", ".join(parts) + ".")


def test_demographics(m: Manifest) -> str | None:
    """Test stays and outcomes per sex and age group, when recorded."""
    groups = (m.metrics.get("fairness") or {}).get("groups") or {
        g: {"n": r["n"], "deaths": r["positives"]} for g, r in
        (m.metrics.get("subgroups") or {}).items()}
    rows = [f"{g} {r['n']} ({r['deaths']} with the outcome)" for g, r in groups.items()
            if g != "all"]
    return ("Test split by group: " + "; ".join(rows) + ".") if rows else None


def own_metrics(m: Manifest) -> dict[str, Any]:
    """The test figures of the model's own source: a site model's parent's."""
    return m.metrics.get(PARENT_KEY, m.metrics) if site_record(m.metrics) else m.metrics


def test_performance(m: Manifest) -> str | None:
    met = own_metrics(m)
    ci_ = met.get("test_ci") or {}
    if not ci_:
        return None
    test = met.get("test", {})
    on = ("the served risk" if met.get("computed_on") == SERVED_RISK
          else "the model's uncalibrated score")
    text = (f"On the held-out test split of {m.provenance.dataset} ({test.get('n', '?')} stays), "
            f"computed on {on}, 95% bootstrap CIs: "
            + "; ".join(f"{k} {ci(v)}" for k, v in ci_.items()) + ".")
    if test.get("ece") is not None:
        text += f" ECE (10 bins) {test['ece']:.4f}."
    return text


def fairness_test(m: Manifest) -> str | None:
    """The fairness audit (or subgroup AUROC) on the test split, when recorded."""
    a = m.metrics.get("fairness")
    if a:
        rows = [f"{g}: AUROC {num(r['auroc'])}, calibration slope "
                f"{num(r['calibration_slope'], 2)}, intercept "
                f"{num(r['calibration_intercept'], 2)}, alert rate {num(r['alert_rate'])}"
                for g, r in a["groups"].items()]
        flip = a.get("sex_flip") or {}
        text = f"On {a['data']}, alerts at {a['alert_rule']}: " + "; ".join(rows) + "."
        if flip.get("n"):
            text += (f" Scoring each stay again with only its sex flipped moves the risk by "
                     f"a median {flip['median']:.4f} (max {flip['max']:.4f}); "
                     f"{flip['alerts_changed']} alerts change.")
        return text
    sub = m.metrics.get("subgroups")
    if sub:
        return "Test AUROC by group: " + "; ".join(
            f"{g} {num(r['auroc'])} (n {r['n']})" for g, r in sub.items()) + "."
    return None


def no_subgroups_reason(m: Manifest) -> str:
    if not task_spec(m.task).binary:
        return ("export measures subgroup figures for a binary task only; this model's "
                f"{len(m.label_names)} labels have none")
    return "this manifest records no subgroup figures (exported before the fairness audit)"


def site_figures(fig: SiteFigures) -> str:
    text = (f"{fig.model} on {fig.on} ({fig.n} stays, {fig.scored} scored, {fig.positives} "
            f"with the outcome): AUROC {ci(fig.auroc)}, AUPRC {ci(fig.auprc)}, ECE "
            f"{ci(fig.ece)}, abstention rate {ci(fig.abstention_rate)}")
    if fig.level is not None and fig.coverage is not None:
        text += f", {fig.level:.0%} outcome-set coverage {ci(fig.coverage)}"
    return text + "."


def bias_approach(m: Manifest) -> str:
    """What was done about fairness, as the manifest shows it."""
    text = ("Each class's calibration map is fitted on held-out stays and the alert "
            "thresholds are chosen on validation stays, for all stays alike.")
    if m.metrics.get("fairness"):
        text += (" At export the risk is audited by sex and age band on the test split "
                 "(AUROC, calibration slope and intercept, alert rate) and each stay is scored "
                 "again with its sex flipped, to show how much the model leans on that field.")
    text += (" The manifest records no bias-mitigation step in training (no reweighting or "
             "constraint by group).")
    return text


def monitoring() -> str:
    """What the service measures on the stays it scores."""
    return ("The service monitors, continuously over the last scored stays of each worker "
            "(SCEHR_MONITOR_WINDOW), each variable's observation rate and population-stability "
            "index against the training data, the served risk's mean and stability index "
            "against validation, and the alert rate at each operating point against "
            "validation (GET /models/{task}/monitoring, Prometheus gauges). It sees no "
            "outcomes: validity on local outcomes is measured by the site with `scehr "
            "evaluate`.")


def lineage(m: Manifest) -> list[str]:
    """How this version came from earlier ones (re-issues, site recalibration)."""
    return [n for n in m.notes if n.startswith("re-issued from")] + (
        site_record(m.metrics).changes if site_record(m.metrics) else [])
