"""MODEL_CARD.md beside each exported model, written from its manifest (numbers, not prose)."""

from __future__ import annotations

from pathlib import Path

from scehr.schemas.manifest import SERVED_RISK, Manifest, PointStats
from scehr.schemas.model_facts import (
    DECISION_ROLE,
    INTENDED_USERS,
    NOT_FOR_CLINICAL_USE,
    RESEARCH_ARTIFACT,
    STANDARD_LIMITATIONS,
)
from scehr.schemas.site import PARENT_KEY
from scehr.schemas.tasks import task_spec
from scehr.schemas.transparency import DOCUMENTS, chai_card_errors, write_documents
from scehr.training.card_sections import (
    data_minimum_lines,
    site_lines,
    uncertainty_lines,
    withheld_lines,
)
from scehr.training.distributed import TRAINING_NOTE
from scehr.training.fairness import audit_lines


def _ci(d: dict | None) -> str:
    if not d or d.get("value") is None:
        return "n/a"
    return f"{d['value']:.3f} [{d['low']:.3f}, {d['high']:.3f}]"


#: Positive test stays below which a label's AUROC is flagged as not evaluable.
MIN_POSITIVES = 10


def _num(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _stats(s: PointStats | None) -> str:
    if s is None:
        return "n/a | n/a | n/a | n/a | n/a"
    return " | ".join(_num(x, 3) for x in (s.sensitivity, s.specificity, s.ppv, s.npv,
                                            s.alert_rate))


def operating_point_table(m: Manifest) -> list[str]:
    """Named operating points on the risk, with validation and test figures, per class."""
    rules = {p.name: p.rule for c in m.classes for p in c.named_points}
    lines = ["", "## Operating points (thresholds on the risk)", "",
             "Chosen on validation; a request picks one with `?operating_point=NAME` (default "
             "marked *) or gives its own `?threshold=`. Se sensitivity, Sp specificity, PPV/NPV "
             "positive/negative predictive value, alert = share of stays alerted.", ""]
    lines += [f"- `{k}`: {v}." for k, v in rules.items()]
    lines += ["", "| class | point | risk threshold | val Se | val Sp | val PPV | val NPV | "
              "val alert | test Se | test Sp | test PPV | test NPV | test alert |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in m.classes:
        for p in c.named_points:
            star = "*" if p.name == c.default_operating_point else ""
            lines.append(f"| {c.label} | {p.name}{star} | {p.threshold:.4f} | "
                         f"{_stats(p.validation)} | {_stats(p.test)} |")
        if not c.named_points:
            lines.append(f"| {c.label} | none reachable | | | | | | | | | | | |")
    return lines


def _auroc_cell(a: float | None, pos: int) -> str:
    if a is None:
        return "not evaluable (no positives or no negatives)"
    return f"too rare to evaluate ({a:.3f})" if pos < MIN_POSITIVES else f"{a:.3f}"


def test_metric_lines(m: Manifest) -> list[str]:
    """Test metrics with CIs and per-label AUROC: of the served risk where the manifest says
    so (`metrics.computed_on`), the model's score beside them; else of the score, said."""
    site = PARENT_KEY in m.metrics  # a site model: the parent's own test figures
    metrics = m.metrics[PARENT_KEY] if site else m.metrics
    on_risk = metrics.get("computed_on") == SERVED_RISK
    score = metrics.get("score", {}) if on_risk else {}
    ci, score_ci = metrics.get("test_ci", {}), score.get("test_ci", {})
    lines = ["", "## The parent model's test metrics (95% bootstrap CI)" if site else
             "## Test metrics (95% bootstrap CI)", "",
             *([f"Those of {metrics['on']}."] if site else []),
             ("Computed on the served `risk` (the calibration map on the model's score), the "
              "number a client is shown; the uncalibrated `score`'s beside it."
              if on_risk else "Computed on the model's uncalibrated `score` (its probability "
              "before the calibration map), not on the served `risk`."),
             "Percentile intervals over resampled test stays; a resample where a metric is "
             "undefined (e.g. a rare label without positives) is skipped, so the interval is "
             "conditional on the resamples counted.", "",
             "| metric | value [95% CI] | resamples counted |"
             + (" score [95% CI] |" if on_risk else ""),
             "|---|---|---:|" + ("---|" if on_risk else "")]
    lines += [f"| {k} | {_ci(v)} | {v.get('n_valid', 'n/a')} of {v.get('n_boot', 'n/a')} |"
              + (f" {_ci(score_ci.get(k))} |" if on_risk else "") for k, v in ci.items()]
    test = metrics.get("test", {})
    if "per_label_auroc" in test:
        n = int(test.get("n", 0))
        lines += ["", "### Per-label test AUROC", "",
                  f"A phenotype with fewer than {MIN_POSITIVES} positive test stays is flagged "
                  "too rare to evaluate: its AUROC is shown in brackets only.", "",
                  "| phenotype | prevalence | positive test stays | AUROC |"
                  + (" score's AUROC |" if on_risk else ""),
                  "|---|---:|---:|---:|" + ("---:|" if on_risk else "")]
        prevs, aurocs = test.get("prevalence", {}), test["per_label_auroc"]
        score_aurocs = score.get("test", {}).get("per_label_auroc", {})
        for name in m.label_names:
            prev = prevs.get(name)
            pos = round((prev or 0.0) * n)
            lines.append(f"| {name} | {_num(prev, 3)} | {pos} | "
                         f"{_auroc_cell(aurocs.get(name), pos)} |"
                         + (f" {_auroc_cell(score_aurocs.get(name), pos)} |" if on_risk else ""))
    return lines


def write_model_card(folder: Path, m: Manifest, command: str, extra: list[str] | None = None
                     ) -> Path:
    """Intended use, data, metrics with CIs, calibration, operating points, fairness audit
    (subgroups and the sex flip), limits; and the transparency documents beside it."""
    never = [k for k, v in m.coverage.items() if v == 0.0]
    lines = [
        f"# Model card: {m.name} {m.version}",
        "",
        f"**{NOT_FOR_CLINICAL_USE}** {RESEARCH_ARTIFACT}",
        "",
        "## Intended use",
        f"Task `{m.task}`: " + task_spec(m.task).description,
        f"Users: {INTENDED_USERS}. {DECISION_ROLE}",
        "",
        "## Model",
        f"- Encoder `{m.encoder.name}` {m.encoder.hparams}, embedding size {m.encoder.out_dim}",
        f"- Loss `{m.loss.name}` + SCR with λ = {m.loss.lam:g} (τ = {m.loss.temperature:g})",
        f"- Feature set `{m.feature_set['name']}` ({m.feature_set['n_features']} features, "
        f"time step {m.feature_set['timestep']:g} h)",
        f"- ONNX opset {m.onnx.opset}, sha256 `{m.onnx.sha256}`; parity with PyTorch: max abs "
        f"error {max(m.onnx.parity_max_abs_error.values(), default=0):.2e}",
        *[f"- {note[:1].upper()}{note[1:]}" for note in m.notes
          if note.startswith(TRAINING_NOTE)],
        "",
        "## Data",
        f"Source: {m.provenance.dataset}.",
        "",
        m.provenance.description,
        "",
        "| split | stays | prevalence |",
        "|---|---:|---|",
    ]
    for s, info in m.provenance.splits.items():
        prev = ", ".join(f"{p:.3f}" for p in info.prevalence[:3])
        lines.append(f"| {s} | {info.n} | {prev}{' ...' if len(info.prevalence) > 3 else ''} |")
    lines += [*site_lines(m), *test_metric_lines(m)]
    if "fairness" in m.metrics:
        lines += audit_lines(m.metrics["fairness"])
    elif "subgroups" in m.metrics:
        lines += ["", "## Subgroup test AUROC", "",
                  "Sex and age from the stay's demographics; n/a where a group has one class.",
                  "", "| group | stays | deaths | AUROC |",
                  "|---|---:|---:|---:|"]
        for g, r in m.metrics["subgroups"].items():
            a = "n/a" if r["auroc"] is None else f"{r['auroc']:.3f}"
            lines.append(f"| {g} | {r['n']} | {r['positives']} | {a} |")
    places = sorted({c.calibration.fitted_on.split("; no map")[0] for c in m.classes})
    lines += ["", "## Calibration", "",
              "Maps fitted on: " + "; ".join(places) + ". For each class the best of a "
              "temperature map, a Platt map (slope and intercept), an isotonic map and no "
              "map by validation Brier score, among those that keep the ranking of the "
              "held-out scores (an isotonic map's steps joined by straight lines, no map that "
              "reaches the risk's bounds); ECE "
              "(10 bins) on validation, which the maps never saw.", "",
              "| class | method | ECE before | ECE after |", "|---|---|---:|---:|"]
    for c in m.classes[:25]:
        cal = c.calibration
        lines.append(f"| {c.label} | {cal.method} | {_num(cal.ece_before)} | "
                     f"{_num(cal.ece_after)} |")
    if any(c.named_points for c in m.classes):
        lines += operating_point_table(m) + withheld_lines(m)
    elif task_spec(m.task).binary:
        lines += ["", "## Operating points (validation data)", "",
                  "Thresholds apply to the model's own probability (`score`), not the risk.",
                  "",
                  "| point | threshold | sensitivity | PPV | specificity | alert rate |",
                  "|---|---:|---:|---:|---:|---:|"]
        for o in m.classes[0].operating_points:
            lines.append(f"| {o.name} | {o.threshold:.3f} | {o.sensitivity:.3f} | {o.ppv:.3f} | "
                         f"{o.specificity:.3f} | {o.alert_rate:.3f} |")
        lines.append(f"\nDefault alert threshold: {m.classes[0].default_threshold:.3f}.")
    lines += data_minimum_lines(m)
    lines += uncertainty_lines(m)
    lines += ["", "## Channels never seen in training", "",
              (", ".join(f"`{c}`" for c in never) if never else "none") + ". The service "
              "treats these as not observed (their normal value) whatever a request sends, "
              "and says so in a warning."]
    lines += ["", "## Limitations", ""] + [f"- {x}" for x in (*(extra or []),
                                                              *STANDARD_LIMITATIONS)] + [
        "", "## Reproduce", "", "```bash", command, "```", ""]
    path = folder / "MODEL_CARD.md"
    path.write_text("\n".join(lines))
    write_transparency(folder, m)
    return path


def write_transparency(folder: Path, m: Manifest) -> list[Path]:
    """The transparency documents beside the card (`scehr.schemas.transparency`), the CHAI
    card checked against its schema: a card that does not validate is never written."""
    errors = chai_card_errors(DOCUMENTS["chai-model-card"][0](m))
    if errors:
        raise ValueError("the CHAI applied model card does not validate: " + "; ".join(errors))
    return write_documents(folder, m)
