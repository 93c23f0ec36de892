"""`scehr recalibrate` writes a complete site model: a written-down split, the calibration map,
the uncertainty map and the operating points refitted on the site (a point the site cannot
support withheld with its reason, levels naming served points only), the site's own figures
where the parent's were, and a clear refusal for a site too small to refit.

The tests drive the command line (`scehr recalibrate`, `scehr models list`) and the service,
as a hospital does; a tiny synthetic model and sites, and the shipped default on the eICU demo.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from scehr.cli import main as scehr
from scehr.schemas.manifest import Manifest, load_manifest, sha256_file
from scehr.service.settings import Settings
from scehr.training.data.synthetic import write_synthetic
from tests.conftest import SHARED_DATA, needs_shared_data
from tests.service.conftest import serve

REPO = Path(__file__).resolve().parents[2]
POINTS = {"high_sensitivity", "balanced", "high_ppv"}


def recalibrate(model: Path, data: Path, out: Path, *extra: str,
                capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`scehr recalibrate MODEL --data DATA --out OUT ...`: (status, stdout, stderr)."""
    capsys.readouterr()
    code = scehr(["recalibrate", str(model), "--data", str(data), "--out", str(out), *extra])
    got = capsys.readouterr()
    return code, got.out, got.err


def served_points_and_levels_agree(parent: Manifest, site: Manifest) -> None:
    """Every point of the parent is served or withheld with a reason; the levels name served
    points; the points rise in threshold and PPV in their names' order."""
    card = site.classes[0]
    served = {p.name for p in card.named_points}
    withheld = {w.name: w.reason for w in card.withheld_points}
    assert {p.name for p in parent.classes[0].named_points} <= served | set(withheld)
    assert served | set(withheld) == POINTS and not served & set(withheld)
    assert all(len(r) > 20 for r in withheld.values()), withheld
    if card.levels is not None:
        assert {card.levels.warning, card.levels.critical} - {None} <= served
    thresholds = [p.threshold for p in card.named_points]
    assert thresholds == sorted(thresholds)


@pytest.mark.anyio
async def test_recalibrate_writes_a_site_model_with_the_sites_maps_points_and_figures(
        home_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    site = write_synthetic(tmp_path / "site", "mortality", n_train=400, n_test=150,
                           prevalence=0.2, seed=7)
    out = tmp_path / "site-models" / "mortality" / "0.1.0-site"
    before = (home_model / "manifest.json").read_text()
    code, printed, err = recalibrate(home_model, site, out, capsys=capsys)
    assert code == 0, err
    assert (home_model / "manifest.json").read_text() == before  # the parent is untouched
    parent, m = load_manifest(home_model / "manifest.json"), load_manifest(out / "manifest.json")
    assert m.version == "0.1.0-site" and m.onnx.sha256 == sha256_file(out / "model.onnx")
    served_points_and_levels_agree(parent, m)
    card = m.classes[0]
    # the uncertainty map is the site's: fitted on its fitting part, at the parent's level,
    # covering each outcome there at the level by construction (Mondrian conformal)
    u = card.uncertainty
    assert u is not None and u != parent.classes[0].uncertainty
    assert "fitting part of site" in u.fitted_on and u.level == parent.classes[0].uncertainty.level
    assert u.validation is not None and u.validation.split == "site fitting part"
    assert u.validation.coverage_with_outcome >= u.level - 1e-9
    assert u.validation.coverage_without_outcome >= u.level - 1e-9
    assert "fitting part of site" in card.calibration.fitted_on
    # the figures are the site's, labelled; the parent's are the parent's
    assert "test_ci" not in m.metrics and m.metrics["parent"]["test_ci"] == \
        parent.metrics["test_ci"]
    record = m.metrics["site"]
    prov, fig = record["provenance"], record["figures"]
    assert fig["n"] == prov["split"]["held_out"]["n"] and fig["on"].startswith("the held-out")
    for k in ("auroc", "auprc", "ece", "coverage", "coverage_with_outcome", "abstention_rate"):
        assert fig[k]["value"] is not None and fig[k]["low"] <= fig[k]["high"], k
    assert set(fig["alert_rates"]) == {p.name for p in card.named_points}
    assert re.fullmatch(r"[0-9a-f]{64}", prov["data_sha256"])
    assert prov["stays"] == 550 and prov["split"]["fit"]["n"] + fig["n"] == 550
    # the split is written down, one row per stay, and its counts are the record's
    rows = (out / "site_split.csv").read_text().splitlines()
    assert rows[0] == "stay,part,meets_minimum" and len(rows) == 551
    assert sum(r.split(",")[1] == "held_out" for r in rows[1:]) == fig["n"]
    assert card.uncertainty.n == prov["split"]["fit"]["scored"]
    # what changed is printed
    assert "what changed against" in printed
    for word in ("calibration:", "point high_sensitivity:", "point balanced:",
                 "point high_ppv:", "levels (warning, critical):", "outcome sets", "HELD-OUT"):
        assert word in printed, word
    # the card shows the site's figures and names the parent's as the parent's
    text = (out / "MODEL_CARD.md").read_text()
    assert "## Site figures" in text and "## The parent model's test metrics" in text
    # scehr models list shows the site's held-out AUROC, labelled, not the parent's test AUROC
    capsys.readouterr()
    assert scehr(["models", "list", "--model-dir", str(out.parent.parent)]) == 0
    listed = capsys.readouterr().out
    assert f"auroc {fig['auroc']['value']:.3f}" in listed and "site held-out part" in listed
    assert f"auroc {parent.metrics['test_ci']['auroc']['value']:.3f}" not in listed
    # the service serves every point by name (a withheld one says why) and shows the figures
    payload = json.loads((REPO / "examples" / "mortality_stay_benchmark17.json").read_text())
    async with serve(Settings(model_dir=out.parent.parent, device="cpu")) as client:
        info = (await client.get("/models/mortality")).json()
        for name in POINTS:
            r = await client.post(f"/predict/mortality?operating_point={name}", json=payload)
            assert r.status_code == 200, (name, r.text)
    assert info["metrics"]["site"]["figures"]["auroc"] == fig["auroc"]
    assert "test_ci" not in info["metrics"]


def test_the_split_is_seeded_and_stratified(home_model: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    site = write_synthetic(tmp_path / "site", "mortality", n_train=400, n_test=150,
                           prevalence=0.2, seed=7)
    files = {}
    for name, seed in (("a", "0"), ("b", "0"), ("c", "1")):
        out = tmp_path / name / "mortality" / "0.1.0-site"
        assert recalibrate(home_model, site, out, "--seed", seed, capsys=capsys)[0] == 0
        files[name] = (out / "site_split.csv").read_text()
        prov = load_manifest(out / "manifest.json").metrics["site"]["provenance"]
        fit, held = prov["split"]["fit"], prov["split"]["held_out"]
        # stratified: each part holds the site's outcome rate, to one stay
        assert abs(held["positives"] - 0.3 * prov["positives"]) <= 1
        assert fit["positives"] + held["positives"] == prov["positives"]
    assert files["a"] == files["b"] and files["a"] != files["c"]


def test_a_site_with_too_few_events_is_refused_naming_the_minimum(
        home_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    site = write_synthetic(tmp_path / "small", "mortality", n_train=120, n_test=40,
                           prevalence=0.1, seed=3)
    out = tmp_path / "site-models" / "mortality" / "0.1.0-site"
    code, _, err = recalibrate(home_model, site, out, capsys=capsys)
    assert code == 1 and not out.exists()
    assert "needs at least 40" in err and "with the outcome" in err


@needs_shared_data
@pytest.mark.anyio
async def test_the_default_recalibrated_on_the_eicu_demo_keeps_every_point_and_its_interval(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The shipped default on the eICU demo (a hospital's path): the site model serves or
    withholds with a reason each of the parent's points, its levels name served points (so
    `critical` can fire), its uncertainty map is refitted on the site, `?operating_point=`
    accepts every name, and `/models` shows the site's figures as the site's."""
    index = json.loads((REPO / "models" / "index.json").read_text())
    version = index["defaults"]["mortality"]
    parent_dir = REPO / "models" / "mortality" / version
    data = tmp_path / "site-data"
    assert scehr(["data", "convert-eicu-demo", str(SHARED_DATA / "eicu-demo"), str(data),
                  "--feature-set", "physionet2012-full"]) == 0
    out = tmp_path / "site-models" / "mortality" / f"{version}-site"
    code, _, err = recalibrate(parent_dir, data, out, capsys=capsys)
    assert code == 0, err
    parent, m = load_manifest(parent_dir / "manifest.json"), load_manifest(out / "manifest.json")
    served_points_and_levels_agree(parent, m)
    u, pu = m.classes[0].uncertainty, parent.classes[0].uncertainty
    assert u is not None and pu is not None and u.fitted_on != pu.fitted_on
    assert (u.event_from, u.no_event_up_to) != (pu.event_from, pu.no_event_up_to)
    figures = m.metrics["site"]["figures"]
    assert figures["scored"] < figures["n"]  # stays below the data minimum abstain
    payload = json.loads((REPO / "examples" / "mortality_stay.json").read_text())
    async with serve(Settings(model_dir=out.parent.parent, device="cpu")) as client:
        info = (await client.get("/models/mortality")).json()
        answers = {name: await client.post(f"/predict/mortality?operating_point={name}",
                                           json=payload) for name in POINTS}
    assert all(r.status_code == 200 for r in answers.values()), {
        k: r.text for k, r in answers.items()}
    assert "test_ci" not in info["metrics"]
    assert info["metrics"]["site"]["figures"]["auroc"]["value"] == figures["auroc"]["value"]
    assert info["metrics"]["parent"]["model"].endswith(version)
    assert np.isclose(info["metrics"]["parent"]["test_ci"]["auroc"]["value"],
                      parent.metrics["test_ci"]["auroc"]["value"])


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
