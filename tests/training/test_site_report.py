"""`scehr evaluate MODEL --data DIR` evaluates the way the service serves: the stays below the
model's data minimum abstain (as `scehr score` says), figures are given on the scored stays and
on all stays with the minimum lifted, a calibration slope or intercept that cannot be
estimated is a warning instead of a number, and the report is report.json plus a
self-contained report.html with its figures. `scehr train`'s calibration.png plots the served
risk. Synthetic data and a tiny model; the real-data cases need ../shared/data."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scehr.schemas.manifest import load_manifest
from scehr.schemas.sufficiency import DataMinimum
from scehr.service.offline_scoring import score
from scehr.training import fairness
from scehr.training.config import TrainConfig
from scehr.training.data.synthetic import write_synthetic
from scehr.training.evaluate import load_predictions, served_risk
from scehr.training.export import export_run, manifest_json
from scehr.training.run import train_run
from scehr.training.site_report import evaluate_external, write_report
from tests.conftest import REPO, SHARED_DATA, needs_shared_data

PLOTS = {"reliability", "roc", "pr", "risk_by_outcome", "coverage_by_decile", "alert_rates"}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny exported model trained on one synthetic site, another site, and what the run
    drew on calibration.png."""
    root = tmp_path_factory.mktemp("site-report")
    home = write_synthetic(root / "home", "mortality", n_train=240, n_test=60, prevalence=0.3,
                           seed=1)
    site = write_synthetic(root / "site", "mortality", n_train=240, n_test=100,
                           prevalence=0.25, seed=7)
    cfg = TrainConfig(task="mortality", data=str(home), out=str(root / "run"), encoder="lstm",
                      encoder_hparams={"units": 4, "depth": 1, "bidirectional": False,
                                       "dropout": 0.0, "static": True},
                      loss="cbce", lam=0.01, batch_size=32, epochs=2, seed=0, threads=1,
                      n_boot=20, tsne=False, progress=False)
    drawn: list[dict[str, tuple[np.ndarray, np.ndarray]]] = []
    import scehr.training.run as run

    real = run.plot_reliability
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(run, "plot_reliability",
                   lambda path, models, **kw: drawn.append(dict(models)) or real(path, models,
                                                                                   **kw))
        train_run(cfg)
    folder = root / "models" / "mortality" / "0.1.0"
    export_run(root / "run", folder)
    return {"root": root, "home": home, "site": site, "folder": folder, "cfg": cfg,
            "drawn": drawn}


def with_minimum(folder: Path, out: Path, site: Path) -> Path:
    """A copy of the model declaring a data minimum that about half the site's stays miss
    (the median number of values a stay holds)."""
    per_stay = [sum(sum(c.strip() != "" for c in line.split(",")[1:])
                    for line in f.read_text().splitlines()[1:])
                for f in sorted((site / "in-hospital-mortality").glob("*/*_timeseries.csv"))]
    shutil.copytree(folder, out)
    m = load_manifest(out / "manifest.json")
    minimum = DataMinimum(min_observations=int(np.median(per_stay)), min_channels=1,
                          rule="test: the median stay's number of values")
    (out / "manifest.json").write_text(manifest_json(m.model_copy(update={
        "data_minimum": minimum, "version": "0.1.0-min"})))
    return out


def test_calibration_png_plots_the_served_risk(setup: dict[str, Any]) -> None:
    """The run's reliability diagram shows the risk the service serves (the calibration map
    fitted as export fits it), not the model's raw probability."""
    preds = load_predictions(Path(setup["cfg"].out))
    risk = served_risk(setup["cfg"], preds)
    assert risk is not None and len(setup["drawn"]) == 1
    (first_name, (_, shown)), *rest = setup["drawn"][0].items()
    assert "served risk" in first_name
    np.testing.assert_allclose(np.asarray(shown), risk["test"])
    if risk["method"] != "none":
        assert not np.allclose(shown, preds["test"]["probability"])
        assert any("not served" in name for name, _ in rest)


def test_abstentions_match_scehr_score_and_figures_come_side_by_side(
        setup: dict[str, Any], tmp_path: Path) -> None:
    site = setup["site"]
    folder = with_minimum(setup["folder"], tmp_path / "model", site)
    report = evaluate_external(folder, site, n_boot=20)
    block = report["models"]["model"]
    a = block["abstention"]
    abstained = 0
    for part in ("train", "test"):
        s = score(str(folder), site / "in-hospital-mortality" / part, tmp_path / f"{part}.jsonl",
                  model_dir=tmp_path, device="cpu", progress=False)
        abstained += s.abstained
    assert 0 < a["abstained"] == abstained < a["n"] == 340
    assert a["scored"] + a["abstained"] == a["n"] and a["rate"]["value"] == pytest.approx(
        abstained / 340)
    assert a["reasons"] and "this model needs at least" in a["reasons"][0]["reason"]
    scored, every = block["scored"]["metrics"], block["all"]["metrics"]
    assert scored["n"] == a["scored"] and every["n"] == 340
    for m in (scored, every):
        for k in ("auroc", "auprc", "ece", "calibration_slope", "calibration_intercept"):
            assert k in m and (m[k]["value"] is not None or m[k].get("warning")), k
    points = block["scored"]["operating_points"]
    assert [p["name"] for p in points] == [
        p.name for p in load_manifest(folder / "manifest.json").classes[0].named_points]
    for p in points:
        assert {"alert_rate", "sensitivity", "ppv", "threshold", "validation"} <= p.keys()
    cov = block["scored"]["coverage"]
    assert cov is not None and {"overall", "with_outcome", "without_outcome"} <= cov.keys()
    assert len(cov["by_decile"]) == 10


def test_the_default_points_alerts_are_the_served_ones(setup: dict[str, Any]) -> None:
    """The report's alerts at a named point (risk >= threshold) are those `scehr score` serves
    at the model's default point."""
    from scehr.training.served_scores import served_scores

    m = load_manifest(setup["folder"] / "manifest.json")
    card = m.classes[0]
    served = served_scores(setup["folder"], setup["site"], m.task, card.label)["served"]
    default = next(p for p in card.named_points if p.name == card.default_operating_point)
    ok = served.status == "ok"
    np.testing.assert_array_equal(served.alert[ok], served.risk[ok] >= default.threshold)


def test_report_json_and_a_self_contained_html_with_every_figure(
        setup: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "report"
    report = write_report(setup["folder"], setup["site"], out, compare=setup["folder"],
                          n_boot=20, command="scehr evaluate x --data y")
    saved = json.loads((out / "report.json").read_text())
    assert saved["models"].keys() == {"model", "compare"}
    assert {"data", "how", "warnings", "models", "site", "plots", "command"} <= saved.keys()
    assert set(report["plots"]) == PLOTS and all((out / f).is_file()
                                                 for f in report["plots"].values())
    page = (out / "report.html").read_text()
    assert page.count("<img ") == len(PLOTS) == page.count("src='data:image/png;base64,")
    assert not re.search(r"(?i)https?://|<script|<link|src='(?!data:)", page)
    for heading in ("Abstention", "Discrimination and calibration", "Risk intervals",
                    "Operating points"):
        assert heading in page
    assert "scehr evaluate x --data y" in page
    fair = saved["site"]["fairness"]
    assert fair["groups"]["all"]["n"] == saved["models"]["model"]["abstention"]["scored"]
    assert fair["sex_flip"]["n"] > 0  # scehr score again, with only the recorded sex flipped


def test_the_training_data_is_flagged_and_the_split_can_be_chosen(setup: dict[str, Any]
                                                                  ) -> None:
    home = setup["home"]
    warnings = evaluate_external(setup["folder"], home, n_boot=5)["warnings"]
    assert any("trained on" in w and "--split test" in w for w in warnings)
    only_test = evaluate_external(setup["folder"], home, split="test", n_boot=5)
    assert only_test["data"]["stays"] == 60
    assert not any("trained on" in w for w in only_test["warnings"])
    site = evaluate_external(setup["folder"], setup["site"], n_boot=5)["warnings"]
    assert not any("trained on" in w for w in site)
    # the synthetic model declares no data minimum: the report says it never abstains
    assert any("declares no data minimum" in w for w in site)


def test_a_slope_or_intercept_that_cannot_be_estimated_is_a_warning() -> None:
    rng = np.random.default_rng(0)
    risk = rng.uniform(0.02, 0.3, 40)
    few = np.zeros(40)
    few[:5] = 1  # 5 events: too few
    fit = fairness.calibration_fit(few, risk)
    assert np.isnan(fit.slope) and np.isnan(fit.intercept)
    assert "5 stays with the outcome" in fit.slope_warning and "at least 10" in fit.slope_warning
    y = (risk > 0.15).astype(float)  # the risk separates the outcomes perfectly
    fit = fairness.calibration_fit(y, risk)
    assert np.isnan(fit.slope) and "separates the outcomes" in fit.slope_warning
    assert np.isfinite(fairness.calibration_fit(rng.random(400) < risk.repeat(10),
                                                risk.repeat(10)).slope)


def test_the_intercept_fit_finds_the_maximum_likelihood_far_from_zero() -> None:
    """Low risks (0.02-0.24) where half the stays die: the intercept is about 2.7; plain
    Newton steps from 0 overshot and ran off to billions."""
    risk = np.tile([0.0187, 0.0267, 0.0306, 0.0345, 0.0352, 0.05, 0.0616, 0.0747, 0.1054,
                    0.1525, 0.2363], 2)
    y = np.tile([0, 0, 0, 1, 0, 1, 1, 1, 1, 0, 0], 2).astype(float)
    lg = np.log(risk / (1 - risk))
    grid = np.linspace(-5, 10, 30001)
    nll = [np.sum(np.logaddexp(0, a + lg) - y * (a + lg)) for a in grid]
    assert fairness.calibration_fit(y, risk).intercept == pytest.approx(
        grid[int(np.argmin(nll))], abs=1e-3)


@pytest.fixture(scope="module")
def eicu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from scehr.schemas.featureset import FEATURE_SETS
    from scehr.training.data.eicu_demo import convert_eicu_demo

    out = tmp_path_factory.mktemp("eicu") / "site-data"
    convert_eicu_demo(SHARED_DATA / "eicu-demo", out, progress=False,
                      fs=FEATURE_SETS["physionet2012-full"])
    return out


@needs_shared_data
def test_evaluate_and_score_report_the_same_abstentions_on_the_eicu_demo(
        eicu: Path, tmp_path: Path) -> None:
    """The shipped default on the eICU demo: `scehr score` abstains on a third of the test
    split; the evaluation counts exactly those stays and reports both populations."""
    model = REPO / "models" / "mortality" / "1.3.1"
    report = evaluate_external(model, eicu, split="test", n_boot=20)
    a = report["models"]["model"]["abstention"]
    s = score(str(model), eicu / "in-hospital-mortality" / "test", tmp_path / "t.jsonl",
              model_dir=REPO / "models", device="cpu", progress=False)
    assert a["n"] == s.read == 173 and a["abstained"] == s.abstained > 0
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert sum(r["status"] == "insufficient_data" for r in rows) == a["abstained"]
    block = report["models"]["model"]
    assert block["scored"]["metrics"]["n"] == 173 - a["abstained"]
    assert block["all"]["metrics"]["n"] == 173


@needs_shared_data
def test_an_intercept_on_five_deaths_is_a_warning_not_a_number(tmp_path: Path) -> None:
    """mortality 1.1.0 on the MIMIC-III demo's test split (11 stays, 5 deaths) printed a
    calibration intercept of 4000021727.401."""
    from scehr.training.data.mimic3.pipeline import extract

    data = tmp_path / "mimic3-demo"
    extract(SHARED_DATA / "mimic3-demo", data, progress=lambda _s: None)
    report = evaluate_external(REPO / "models" / "mortality" / "1.1.0", data, split="test",
                               n_boot=50)
    m = report["models"]["model"]["scored"]["metrics"]
    assert m["n"] == 11 and m["events"] == 5
    for k in ("calibration_intercept", "calibration_slope"):
        assert m[k]["value"] is None and m[k]["low"] is None, m[k]
        assert "5 stays with the outcome" in m[k]["warning"]
    assert any("calibration intercept cannot be estimated" in w for w in report["warnings"])
    every = evaluate_external(REPO / "models" / "mortality" / "1.1.0", data, n_boot=50)
    ci = every["models"]["model"]["scored"]["metrics"]["calibration_intercept"]
    assert ci["value"] is None or (abs(ci["low"]) < 10 and abs(ci["high"]) < 10), ci
