"""Export, re-issue and `scehr recalibrate` write the transparency documents beside the model:
the texts the service serves for it, the CHAI card valid; a site model's documents answer
the external and local validation attributes with the site's own figures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scehr.cli import main as scehr
from scehr.schemas.manifest import Manifest, load_manifest
from scehr.schemas.model_facts import ci
from scehr.schemas.transparency import (
    ANSWERED,
    DOCUMENTS,
    FOLDER,
    chai_card_errors,
    document_text,
    hti1,
    tripod_ai,
)
from scehr.training.data.synthetic import write_synthetic
from scehr.training.reissue import reissue


def written_documents_are_the_served_ones(folder: Path) -> Manifest:
    m = load_manifest(folder / "manifest.json")
    files = {p.name for p in (folder / FOLDER).iterdir()}
    assert files == {file for _, _, file in DOCUMENTS.values()}
    for name, (_, _, file) in DOCUMENTS.items():
        assert (folder / FOLDER / file).read_text() == document_text(name, m), file
    assert chai_card_errors((folder / FOLDER / "chai-model-card.xml").read_text()) == []
    return m


def card_headings(folder: Path) -> set[str]:
    return set(re.findall(r"^#{1,3} (.+)$", (folder / "MODEL_CARD.md").read_text(), flags=re.M))


def test_export_and_reissue_write_the_documents(home_model: Path, tmp_path: Path) -> None:
    written_documents_are_the_served_ones(home_model)
    out = tmp_path / "models" / "mortality" / "0.1.1"
    reissue(home_model, out, minimum=None, command="python -m scehr.training.reissue ...")
    m = written_documents_are_the_served_ones(out)
    update = hti1(m)["attributes"][29]
    assert update["status"] == ANSWERED and "re-issued from" in update["answer"]
    assert next(i for i in tripod_ai(m)["items"] if i["item"] == "24")["status"] == "reported"


def test_a_site_models_documents_carry_the_site_figures(
        home_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    site = write_synthetic(tmp_path / "site", "mortality", n_train=400, n_test=150,
                           prevalence=0.2, seed=7)
    out = tmp_path / "site-models" / "mortality" / "0.1.0-site"
    assert scehr(["recalibrate", str(home_model), "--data", str(site), "--out", str(out)]) == 0
    capsys.readouterr()
    m = written_documents_are_the_served_ones(out)
    fig = m.metrics["site"]["figures"]
    attrs = hti1(m)["attributes"]
    # (6)(i) external data source, (7)(iii) external validity, (8)(ii) local validity
    for number in (17, 23, 27):
        assert attrs[number - 1]["status"] == ANSWERED, attrs[number - 1]
    assert site.name in attrs[16]["answer"]
    assert f"AUROC {ci(fig['auroc'])}" in attrs[22]["answer"] == attrs[26]["answer"]
    # (7)(i): the parent's own test figures, not the site's
    parent = m.metrics["parent"]["test_ci"]["auroc"]
    assert f"auroc {ci(parent)}" in attrs[20]["answer"]
    headings = card_headings(out)
    sections = [w["section"] for i in tripod_ai(m)["items"] for w in i["where"]
                if "section" in w]
    assert "Site figures (95% bootstrap CI)" in sections
    assert set(sections) <= headings, set(sections) - headings
