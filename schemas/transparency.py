"""Transparency documents of a model, built from its manifest alone: the 31 ONC HTI-1 source
attributes of a predictive decision support intervention, the CHAI applied model card and the
TRIPOD+AI checklist mapped to where the model card answers each item.

One function builds each document (`DOCUMENTS`); `scehr export`, the re-issue and `scehr
recalibrate` write them beside a new model (`transparency/`), and the service builds them on
the fly for every version it serves (shipped folders are immutable, so it cannot rely on files
written at export). The texts of the standards live in `resources/` with their sources. The
facts come from `scehr.schemas.model_facts`; where the manifest records nothing, a document
says so and why.

The CHAI schema is an XML Schema (XSD): the card is XML. Checking it needs `xmlschema` (the
`train` and `dev` extras); building it needs only the standard library.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from scehr.schemas import model_facts as f
from scehr.schemas.manifest import Manifest
from scehr.schemas.site import site_record
from scehr.schemas.tasks import task_spec

RESOURCES = Path(__file__).with_name("resources")
CHAI_XSD = RESOURCES / "chai_applied_model_card_v0.2.xsd"
CHAI_NS = "https://mc.chai.org/v0.2/schema.xsd"
ANSWERED, NOT_APPLICABLE, NOT_REPORTED = "answered", "not_applicable", "not_reported"


@cache
def _resource(name: str) -> dict[str, Any]:
    return json.loads((RESOURCES / name).read_text())


def _answer(text: str | None, why_not: str, sources: list[str],
            status_if_none: str = NOT_REPORTED) -> dict[str, Any]:
    """An attribute's answer, or its status and the reason there is none."""
    if text:
        return {"status": ANSWERED, "answer": text, "reason": None, "sources": sources}
    return {"status": status_if_none, "answer": None, "reason": why_not, "sources": sources}


def _hti1_answers(m: Manifest) -> list[dict[str, Any]]:
    """The answers to attributes 1..31, in the rule's order."""
    site = site_record(m.metrics)
    demo = f.demographic_inputs(m)
    others = [v for v in _resource("hti1_source_attributes.json")["demographic_variables"]
              if not any(v in d for d in demo)]
    fairness = f.fairness_test(m)
    no_external = ("no evaluation on data from another source is recorded in this version's "
                   "manifest; a site measures one with `scehr evaluate MODEL --data SITE` and "
                   "builds its own version with `scehr recalibrate` (docs/hospital.md)")
    site_data = (f"{site.provenance.data}: {site.provenance.stays} stays of the site, "
                 f"{site.provenance.split.rule}" if site else None)
    local = f.site_figures(site.figures) if site else None
    provenance = ["manifest.provenance", "MODEL_CARD.md#Data"]
    return [
        _answer(f"Developer: {f.DEVELOPER}. Contact: the maintainers of the scehr repository "
                f"this model was built from (code version {m.code_version}).", "", []),
        _answer(None, "the manifest records no funding source", []),
        _answer(f.output_value(m), "", ["manifest.classes", "MODEL_CARD.md#Operating points"]),
        _answer(f.output_kind(m), "", ["manifest.task", "manifest.label_names"]),
        _answer(f.intended_use(m), "", ["MODEL_CARD.md#Intended use"]),
        _answer(f.population(m), "", [*provenance, "manifest.data_minimum"]),
        _answer(f.INTENDED_USERS[0].upper() + f.INTENDED_USERS[1:] + ".", "",
                ["MODEL_CARD.md#Intended use"]),
        _answer(f"Informs: {f.DECISION_ROLE} It does not replace clinical management.", "",
                ["MODEL_CARD.md#Intended use"]),
        _answer(f.cautions(m), "", ["MODEL_CARD.md#Limitations", "manifest.data_minimum"]),
        _answer(f.limitations(m), "", ["MODEL_CARD.md#Limitations"]),
        _answer(f"{m.provenance.description} The manifest records no other inclusion or "
                "exclusion rule.", "", provenance),
        _answer(("Used: " + ", ".join(demo) + ". Not used: " + ", ".join(others) + ".")
                if demo else "None: the model reads no demographic input (" + ", ".join(
                    others) + " are all absent from its inputs).", "",
                ["manifest.encoder.uses_static", "manifest.static"]),
        _answer(" ".join(x for x in (f.training_demographics(m), f.test_demographics(m)) if x),
                "the manifest records no demographics of the training data: "
                + ("the model reads none" if not demo else "none were kept at export")
                + "; race, ethnicity and the other variables are not recorded", provenance),
        _answer(f"Trained on {m.provenance.dataset}. "
                + (f"This site model's maps and points were refitted on {site_data}."
                   if site else "A hospital other than this source must check the model on "
                   "its own stays before use (`scehr evaluate`), and can refit its maps and "
                   "points on them (`scehr recalibrate`)."), "", provenance),
        _answer(f.bias_approach(m), "", ["MODEL_CARD.md#Fairness audit", "manifest.metrics"]),
        _answer(f.bias_approach(m), "", ["manifest.metrics.fairness"]),
        _answer(site_data, no_external, ["manifest.metrics.site"]),
        _answer("Whoever ran `scehr recalibrate` on the site's stays (the deploying site)"
                if site else None, no_external, ["manifest.metrics.site"]),
        _answer(None, (f"the site record holds no demographics of {site.provenance.data}"
                       if site else no_external), ["manifest.metrics.site"]),
        _answer(f"{site.provenance.split.rule}; the figures are measured on the held-out part "
                "with 95% bootstrap CIs, the parent's beside them." if site else None,
                no_external, ["manifest.metrics.site"]),
        _answer(f.test_performance(m), "the manifest records no test metrics",
                ["manifest.metrics.test_ci", "MODEL_CARD.md#Test metrics"]),
        _answer(fairness, f.no_subgroups_reason(m), ["manifest.metrics.fairness"]),
        _answer(local, no_external, ["manifest.metrics.site"]),
        _answer(None, (f"the site record holds no subgroup figures of {site.provenance.data}"
                       if site else no_external), ["manifest.metrics.site"]),
        _answer(None, "no evaluation of the model's use on patient outcomes exists; the method "
                f"is described in {f.METHOD_REFERENCE}", []),
        _answer(f.monitoring(), "", ["GET /models/{task}/monitoring"]),
        _answer(local, "none recorded for this version: a site measures it on its own "
                "labelled stays (`scehr evaluate`) or builds a site model (`scehr "
                "recalibrate`)", ["manifest.metrics.site"]),
        _answer(None, "the service keeps no demographics of the stays it scores (patient data "
                "never reaches its logs or metrics), so it cannot monitor fairness; a site "
                "repeats the audit on its own labelled stays", []),
        _answer(None, "none recorded for this version: the site record holds no subgroup "
                "figures" if site else "none recorded for this version", ["manifest.metrics"]),
        _answer("A shipped version is never changed: an update is a new version (a new "
                "training and `scehr export`, a re-issue of the same graph, or a site's "
                "`scehr recalibrate`), recorded in the manifest's notes. No fixed schedule is "
                "set. This version's history: " + ("; ".join(f.lineage(m)) or "first issue")
                + ".", "", ["manifest.notes"]),
        _answer("No fixed frequency: a correction is a new version, made when monitoring or a "
                "site's evaluation shows a risk; the served default moves only when an "
                "operator chooses it (models/index.json).", "", ["models/index.json"]),
    ]


def hti1(m: Manifest) -> dict[str, Any]:
    """The 31 HTI-1 source attributes, each answered from the manifest or marked not
    applicable / not reported with the reason."""
    spec = _resource("hti1_source_attributes.json")
    answers = _hti1_answers(m)
    assert len(answers) == len(spec["attributes"]) == 31
    return {"document": "hti1", "standard": spec["standard"], "citation": spec["citation"],
            "model": _model_ref(m),
            "attributes": [{**a, **ans} for a, ans in zip(spec["attributes"], answers,
                                                          strict=True)]}


def _model_ref(m: Manifest) -> dict[str, str]:
    return {"task": m.task, "name": m.name, "version": m.version,
            "onnx_sha256": m.onnx.sha256}


def _metric(label: str, value: Any) -> dict[str, str]:
    """A CHAI MetricResult: an estimate with its 95% CI, or one number."""
    d = value if isinstance(value, dict) else {"value": value}
    if d.get("low") is not None:
        v = {"kind": "estimate_ci", "estimate": round(d["value"], 4),
             "lower": round(d["low"], 4), "upper": round(d["high"], 4), "level": 95}
    else:
        v = {"kind": "single", "value": None if d["value"] is None else round(d["value"], 4)}
    return {"Label": label, "ValueJson": json.dumps(v, separators=(",", ":"))}


def _key_metrics(m: Manifest) -> dict[str, Any]:
    met = f.own_metrics(m)
    test = met.get("test", {})
    where = f"the held-out test split of {m.provenance.dataset} ({test.get('n', '?')} stays)"
    process = ("Split by the training config (docs/training.md); figures computed at export "
               "with 1000 bootstrap resamples of the test stays.")
    use = [_metric(f"test {k}", v) for k, v in (met.get("test_ci") or {}).items()] or [
        _metric("test metrics recorded", 0)]
    groups = (m.metrics.get("fairness") or {}).get("groups") or {}
    fair = [_metric(f"AUROC, {g}", r["auroc"]) for g, r in groups.items()]
    fair += [_metric(f"calibration slope, {g}", r["calibration_slope"])
             for g, r in groups.items()]
    if not fair:
        fair = [_metric(f"{g} AUROC", r["auroc"]) for g, r in
                (m.metrics.get("subgroups") or {}).items()] or [
            _metric("sociodemographic subgroups with figures", 0)]
    safety = [_metric("test ECE (10 bins)", test["ece"])] if test.get("ece") is not None else []
    d = m.data_minimum
    if d is not None and d.test is not None:
        safety.append(_metric("test abstention rate (below the data minimum)",
                              1 - d.test.kept / d.test.n))
    for c in m.classes[:1]:
        if c.uncertainty is not None and c.uncertainty.test is not None:
            safety.append(_metric(f"{c.label}: test outcome-set coverage at level "
                                  f"{c.uncertainty.level:.2f}", c.uncertainty.test.coverage))
    if not safety:
        safety = [_metric("safety figures recorded", 0)]

    def block(goal: str, results: list, meaning: str) -> dict[str, Any]:
        return {"MetricGoal": goal, "Results": {"MetricResult": results},
                "Interpretation": meaning, "TestType": "Retrospective, held-out test split",
                "TestingDataDescription": where, "ValidationProcessAndJustification": process}

    return {
        "UsefulnessUsabilityEfficacy": block(
            "Discrimination of the outcome on held-out stays", use,
            f.test_performance(m) or "No test metrics are recorded."),
        "FairnessEquity": block(
            "Comparable discrimination and calibration across sex and age groups", fair,
            f.fairness_test(m) or f"None: {f.no_subgroups_reason(m)}."),
        "SafetyReliability": block(
            "Calibrated risks, abstention below the data minimum, interval coverage", safety,
            "ECE near 0 means the risk matches observed rates; abstained stays get no risk."),
    }


def chai_card(m: Manifest) -> dict[str, Any]:
    """The CHAI applied model card's content, element name -> text or sub-elements, in the
    order its schema requires."""
    demo = f.training_demographics(m)
    site = site_record(m.metrics)
    return {
        "BasicInfo": {"ModelName": f"{m.name} {m.version}", "ModelDeveloper": f.DEVELOPER,
                      "DeveloperContact": "The maintainers of the scehr repository this model "
                      f"was built from (code version {m.code_version})."},
        "ReleaseInfo": {"ReleaseStage": f.RELEASE_STAGE, "ReleaseDate": m.created_at[:10],
                        "ReleaseVersion": m.version,
                        "GlobalAvailability": "Open source (MIT licence), wherever the "
                        "repository is available.",
                        "RegulatoryApproval": "None recorded."},
        "ModelSummary": {"Summary": f"{f.intended_use(m)} {f.output_value(m)}",
                         "Keywords": {"Keyword": ["ICU", m.task, m.encoder.name, m.loss.name,
                                                  "supervised contrastive learning"]}},
        "UsesAndDirections": {
            "IntendedUseAndWorkflow": f.intended_use(m),
            "PrimaryIntendedUsers": f.INTENDED_USERS[0].upper() + f.INTENDED_USERS[1:] + ".",
            "HowToUse": "Send a stay's time series to POST /predict/{task} (JSON, FHIR R4 or "
            "CDS Hooks); read the risk with its interval, the alert at the chosen operating "
            "point and the explanation, or the abstention and its reasons.".replace(
                "{task}", m.task),
            "TargetedPatientPopulation": f.population(m),
            "CautionedOutOfScopeSettings": f.cautions(m)},
        "Warnings": {"KnownRisksAndLimitations": f.limitations(m),
                     "KnownBiasesOrEthicalConsiderations": f.fairness_test(m)
                     or f"Not measured: {f.no_subgroups_reason(m)}.",
                     "ClinicalRiskLevel": "Not assessed: a research artifact, not classified "
                     "by any regulator."},
        "TrustIngredients": {
            "AISystemFacts": {
                "OutcomesAndOutputs": f.output_value(m),
                "ModelType": f"Encoder `{m.encoder.name}` (embedding size "
                f"{m.encoder.out_dim}) with per-class anchors, loss `{m.loss.name}` with a "
                f"supervised contrastive regularizer (λ = {m.loss.lam:g}); an ONNX graph "
                f"(opset {m.onnx.opset}, sha256 {m.onnx.sha256}).",
                "InputDataSource": f"{m.provenance.dataset}. {m.provenance.description}",
                "OutputAndInputDataTypes": f"Input: {f.inputs(m)} Output: {f.output_kind(m)}.",
                "DevelopmentDataCharacterization": "Splits: " + "; ".join(
                    f"{s} {i.n} stays" for s, i in m.provenance.splits.items()) + ". "
                + (demo or "No demographics of the training data are recorded."),
                "BiasMitigationApproaches": f.bias_approach(m),
                "OngoingMaintenance": f.monitoring(),
                "Transparency": "These documents (HTI-1 source attributes, this card, the "
                "TRIPOD+AI checklist) are built from the manifest: GET "
                f"/models/{m.task}/{m.version}/transparency/{{document}}; the model card: "
                f"GET /models/{m.task}/card."},
            "TransparencyInformation": {
                "FundingSource": "None recorded in the manifest.",
                "ThirdPartyInformation": (f"Site model of {site.provenance.parent}, "
                                          f"recalibrated on {site.provenance.data}."
                                          if site else "None."),
                "StakeholdersConsulted": "None recorded."}},
        "KeyMetrics": _key_metrics(m),
        "Resources": {
            "EvaluationReferences": "MODEL_CARD.md beside the model (GET "
            f"/models/{m.task}/card).",
            "PeerReviewedPublications": f"None for this model. The method: {f.METHOD_REFERENCE}.",
            "PatientConsentOrDisclosure": "None recorded: the model was trained on "
            f"{m.provenance.dataset} under its licence; a deploying site decides how patients "
            "are told that a model informs their care."},
        "Bibliography": "@misc{zang2021scehr, author = {Zang, Chengxi and Wang, Fei}, title = "
        "{SCEHR: Supervised Contrastive Learning for Clinical Risk Prediction using Electronic "
        "Health Records}, year = {2021}, eprint = {2110.04943}, archivePrefix = {arXiv}}",
    }


def _xml(parent: ET.Element, content: dict[str, Any]) -> None:
    for name, value in content.items():
        for item in value if isinstance(value, list) else [value]:
            child = ET.SubElement(parent, f"{{{CHAI_NS}}}{name}")
            if isinstance(item, dict):
                _xml(child, item)
            else:
                child.text = str(item)


def chai_card_xml(m: Manifest) -> str:
    """The CHAI applied model card as its schema's XML (`chai_card`'s content)."""
    ET.register_namespace("", CHAI_NS)
    root = ET.Element(f"{{{CHAI_NS}}}AppliedModelCard")
    _xml(root, chai_card(m))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def chai_card_errors(xml: str) -> list[str]:
    """Why `xml` is not a valid CHAI applied model card (empty: it is), checked against the
    vendored schema without any network access (needs `xmlschema`)."""
    import xmlschema

    schema = _chai_schema(xmlschema)
    return [f"{e.path}: {e.reason}" for e in schema.iter_errors(xml)]


@cache
def _chai_schema(xmlschema: Any) -> Any:
    # allow="local": the schema imports XML Signature from the web; xmlschema ships it
    return xmlschema.XMLSchema(str(CHAI_XSD), allow="local", defuse="always")


REPORTED, PARTLY = "reported", "partly_reported"


def card_sections(m: Manifest) -> dict[str, str]:
    """The model card's sections for `m` (`scehr.training.model_card` writes them): a short
    key -> the heading as written, only those the card of this manifest has."""
    site = site_record(m.metrics) is not None
    out = {"title": f"Model card: {m.name} {m.version}", "use": "Intended use",
           "model": "Model", "data": "Data",
           "test": ("The parent model's test metrics (95% bootstrap CI)" if site
                    else "Test metrics (95% bootstrap CI)"),
           "calibration": "Calibration", "minimum": "Data minimum",
           "uncertainty": "Uncertainty", "never": "Channels never seen in training",
           "limits": "Limitations", "reproduce": "Reproduce"}
    if site:
        out["site"] = "Site figures (95% bootstrap CI)"
    if "fairness" in m.metrics:
        out["fairness"] = "Fairness audit"
    elif "subgroups" in m.metrics:
        out["fairness"] = "Subgroup test AUROC"
    if any(c.named_points for c in m.classes):
        out["points"] = "Operating points (thresholds on the risk)"
    elif task_spec(m.task).binary:
        out["points"] = "Operating points (validation data)"
    return out


def _tripod_answers(m: Manifest) -> dict[str, tuple[str, list[str], str]]:
    """Item -> (status, where: card sections (keys of `card_sections`) and manifest fields,
    a note: what is there, or why nothing is)."""
    s = card_sections(m)
    site = "site" in s
    fair = "fairness" in s
    updated = bool(f.lineage(m))
    none = (NOT_REPORTED, [])
    return {
        "1": (REPORTED, ["title", "use"], "The card's title names the model; Intended use "
              "names the population and the outcome."),
        "2": (NOT_APPLICABLE, [], "A model card, not an article: it has no abstract; Intended "
              "use and the test metrics summarize it."),
        "3a": (PARTLY, ["use"], "The task and its use are stated; no existing model is "
               f"referenced (the method: {f.METHOD_REFERENCE})."),
        "3b": (REPORTED, ["use"], "Population, purpose and intended users."),
        "3c": (*none, "The card states no known health inequalities between groups."),
        "4": (REPORTED, ["use", "test"], "Development of the model and its evaluation on a "
              "held-out test split."),
        "5a": (REPORTED, ["data", "manifest.provenance"], "Source, description and splits."),
        "5b": (*none, "The manifest records no accrual dates; the data set's own "
               "documentation has them."),
        "6a": (PARTLY, ["data"], "ICU stays of the named data set; number and location of "
               "centres only as far as the data description says."),
        "6b": (PARTLY, ["data", "minimum"], "The data description; the data minimum a stay "
               "needs to be scored."),
        "6c": (*none, "Treatments are not recorded or handled."),
        "7": (PARTLY, ["model", "never", "manifest.feature_set", "manifest.normalizer"],
              "Time grid, imputation and normalization; not compared across groups."),
        "8a": (PARTLY, ["use"], "The outcome and its horizon; how it was assessed is the data "
               "set's."),
        "8b": (*none, f"Labels come with the data set ({m.provenance.dataset}); its assessors "
               "are not recorded."),
        "8c": (*none, "No blinding of the outcome is described."),
        "9a": (PARTLY, ["model", "manifest.feature_set"], "The feature set in use; why these "
               "predictors is not stated in the card."),
        "9b": (REPORTED, ["model", "manifest.feature_set"], "Each variable with its unit and "
               "encoding, the time grid and window."),
        "9c": (*none, "Who measured the inputs is not recorded."),
        "10": (PARTLY, ["data"], "Split sizes; no sample-size calculation was made."),
        "11": (REPORTED, ["model", "never", "minimum", "manifest.coverage"], "Carry-forward "
               "imputation with masks, normal values where never observed, abstention below "
               "the data minimum; per-variable coverage in the manifest."),
        "12a": (REPORTED, ["data"], "Train, validation, calibration and test splits."),
        "12b": (REPORTED, ["model", "manifest.normalizer", "manifest.feature_set"],
                "Continuous values z-scored on the training split, categories one-hot."),
        "12c": (PARTLY, ["model", "reproduce"], "Encoder, loss and training command; how the "
                "hyper-parameters were chosen is not stated in the card."),
        "12d": (*none, "No figures per hospital or other cluster."),
        "12e": (REPORTED, ["test", "calibration", "points"], "AUROC and AUPRC with "
                "bootstrap CIs, calibration (ECE), operating points."),
        "12f": (REPORTED, ["calibration", *(["site"] if site else [])], "Calibration maps "
                "fitted on held-out stays" + ("; the site's refit." if site else ".")),
        "12g": (REPORTED, ["model", "reproduce"], "The ONNX graph (sha256) the service runs."),
        "13": (PARTLY, ["model", "manifest.loss"], "The loss and its parameters; any "
               "sampling is in the training config named under Reproduce."),
        "14": (REPORTED, ["fairness"], "The fairness audit by sex and age band.") if fair
        else (*none, f"No approach recorded: {f.no_subgroups_reason(m)}."),
        "15": (REPORTED, ["points", "calibration"], "The risk (calibrated probability) and "
               "the named thresholds with the rule that chose each."),
        "16": (REPORTED, ["data", *(["site"] if site else [])], "Development and test data "
               "are splits of one source" + ("; the site's stays differ." if site else ".")),
        "17": (*none, "No ethics committee is named; the data are used under their "
               "licences."),
        "18a": (*none, "No funding source is recorded."),
        "18b": (*none, "No conflicts of interest are declared."),
        "18c": (*none, "No protocol is named."),
        "18d": (*none, "No registration is named."),
        "18e": (REPORTED, ["data", "manifest.provenance"], "The data set and its licence."),
        "18f": (REPORTED, ["reproduce", "manifest.code_version"], "The commands and the code "
                "version (open source)."),
        "19": (*none, "No patient or public involvement is recorded."),
        "20a": (PARTLY, ["data", "minimum"], "Stays and outcome rates per split, stays kept "
                "by the data minimum; no diagram."),
        "20b": (PARTLY, ["data", *(["fairness"] if fair else []), "manifest.coverage"],
                "Sizes and outcome rates" + (", groups" if fair else "") + "; per-variable "
                "coverage in the manifest."),
        "20c": (*none, "No comparison of predictor distributions; the service's monitor "
                "compares served stays with the training distribution."),
        "21": (REPORTED, ["data"], "Stays and outcome rates of each split."),
        "22": (REPORTED, ["model", "reproduce"], "The ONNX graph with its sha256 and the "
               "manifest, freely available (MIT)."),
        "23a": (PARTLY, ["test", *(["fairness"] if fair else [])], "Test figures with CIs"
                + ("; subgroup figures without CIs." if fair else "; no subgroups.")),
        "23b": (*none, "No heterogeneity across clusters examined."),
        "24": (REPORTED, ["limits", *(["site"] if site else []), "manifest.notes"],
               "What the update changed and its figures.") if updated or site else
        (NOT_APPLICABLE, [], "This version is a first issue: it was not updated."),
        "25": (*none, "No overall interpretation against previous studies."),
        "26": (REPORTED, ["limits"], "The model's limitations."),
        "27a": (REPORTED, ["minimum", "never"], "Abstention below the data minimum; variables "
                "never seen in training treated as not observed."),
        "27b": (PARTLY, ["use"], "The intended users; no interaction with inputs is needed "
                "beyond sending the stay."),
        "27c": (PARTLY, ["limits"], "Checking performance locally before use."),
    }


def tripod_ai(m: Manifest) -> dict[str, Any]:
    """The TRIPOD+AI checklist, each item mapped to the model card sections (and manifest
    fields) that answer it, or marked not reported / not applicable with why."""
    spec = _resource("tripod_ai_checklist.json")
    sections = card_sections(m)
    answers = _tripod_answers(m)
    items = []
    for item in spec["items"]:
        status, where, note = answers[item["item"]]
        items.append({**item, "status": status, "note": note, "where": [
            {"manifest": w.removeprefix("manifest.")} if w.startswith("manifest.")
            else {"card": "MODEL_CARD.md", "section": sections[w]} for w in where
            if w.startswith("manifest.") or w in sections]})
    return {"document": "tripod-ai", "standard": spec["standard"],
            "citation": spec["citation"], "model": _model_ref(m), "items": items}


def _cell(text: str | None) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")


def markdown(m: Manifest) -> str:
    """The HTI-1 attributes and the TRIPOD+AI checklist as Markdown tables, for a reader of the
    model's folder."""
    lines = [f"# Transparency: {m.name} {m.version}", "",
             "Built from the model's manifest (docs/transparency.md); the CHAI applied model "
             "card is `chai-model-card.xml`.", "", "## HTI-1 source attributes", "",
             "| # | paragraph | attribute | status | answer, or why not |",
             "|---:|---|---|---|---|"]
    lines += [f"| {a['number']} | {a['paragraph']} | {_cell(a['attribute'])} | {a['status']} "
              f"| {_cell(a['answer'] or a['reason'])} |" for a in hti1(m)["attributes"]]
    lines += ["", "## TRIPOD+AI checklist", "",
              "| item | topic | status | where (MODEL_CARD.md section, manifest field) | note |",
              "|---|---|---|---|---|"]
    for i in tripod_ai(m)["items"]:
        where = "; ".join(w.get("section") or f"manifest `{w['manifest']}`" for w in i["where"])
        lines.append(f"| {i['item']} | {_cell(i['topic'])} | {i['status']} | {_cell(where)} | "
                     f"{_cell(i['note'])} |")
    return "\n".join(lines) + "\n"


#: Document name (the route's and the file's) -> (builder, media type, file name).
DOCUMENTS: dict[str, tuple[Callable[[Manifest], Any], str, str]] = {
    "hti1": (hti1, "application/json", "hti1.json"),
    "chai-model-card": (chai_card_xml, "application/xml", "chai-model-card.xml"),
    "tripod-ai": (tripod_ai, "application/json", "tripod-ai.json"),
    "markdown": (markdown, "text/markdown", "TRANSPARENCY.md"),
}


def document_text(name: str, m: Manifest) -> str:
    """Document `name` of `m` as the text served and written (JSON indented, XML)."""
    doc = DOCUMENTS[name][0](m)
    return doc if isinstance(doc, str) else json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


#: The folder beside a model's manifest that export, re-issue and recalibrate write them in.
FOLDER = "transparency"


def write_documents(model_folder: Path, m: Manifest) -> list[Path]:
    """Write every document of `m` into `model_folder/transparency/`, the texts the service
    serves for it; returns the files written."""
    out = model_folder / FOLDER
    out.mkdir(exist_ok=True)
    paths = []
    for name, (_, _, file) in DOCUMENTS.items():
        path = out / file
        path.write_text(document_text(name, m))
        paths.append(path)
    return paths


def summary(m: Manifest) -> list[str]:
    """One line per document: how many items are answered, and the CHAI card's validation."""
    from collections import Counter

    att = Counter(a["status"] for a in hti1(m)["attributes"])
    items = Counter(i["status"] for i in tripod_ai(m)["items"])
    errors = chai_card_errors(chai_card_xml(m))
    return [f"{m.task} {m.version}",
            "  hti1: " + ", ".join(f"{k} {v}" for k, v in sorted(att.items())),
            "  tripod-ai: " + ", ".join(f"{k} {v}" for k, v in sorted(items.items())),
            "  chai-model-card: " + ("valid against " + CHAI_XSD.name if not errors
                                     else "INVALID: " + "; ".join(errors))]


def main(argv: list[str] | None = None) -> int:
    """`python -m scehr.schemas.transparency MODEL_DIR...`: each model's summary; with --out
    DIR, the documents written under DIR/<task>/<version>/ (never into a shipped folder)."""
    import argparse

    from scehr.schemas.manifest import load_manifest

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("models", type=Path, nargs="+", help="model folders (manifest.json)")
    ap.add_argument("--out", type=Path, default=None, help="write the documents under it")
    args = ap.parse_args(argv)
    bad = 0
    for folder in args.models:
        m = load_manifest(folder / "manifest.json")
        lines = summary(m)
        bad += "INVALID" in lines[-1]
        print("\n".join(lines))
        if args.out is not None:
            target = args.out / m.task / m.version
            target.mkdir(parents=True, exist_ok=True)
            for path in write_documents(target, m):
                print(f"  wrote {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
