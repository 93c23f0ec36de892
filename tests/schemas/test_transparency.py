"""The transparency documents of the shipped models: all 31 HTI-1 source attributes answered
or marked with why not, a CHAI applied model card that validates against the vendored CHAI
schema (and a broken one that does not), and a TRIPOD+AI checklist whose every reference to
the model card names a section the card has."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from scehr.schemas.manifest import Manifest, load_manifest
from scehr.schemas.transparency import (
    ANSWERED,
    CHAI_NS,
    DOCUMENTS,
    NOT_APPLICABLE,
    NOT_REPORTED,
    chai_card_errors,
    chai_card_xml,
    document_text,
    hti1,
    tripod_ai,
)

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
INDEX = json.loads((MODELS / "index.json").read_text())
DEFAULTS = [MODELS / task / v for task, v in INDEX["defaults"].items()]
MORTALITY, PHENOTYPES = (MODELS / t / INDEX["defaults"][t] for t in ("mortality", "phenotypes"))
SHIPPED = [MODELS / e["path"] for e in INDEX["models"]]


def manifest(folder: Path) -> Manifest:
    return load_manifest(folder / "manifest.json")


def folder_files(folder: Path) -> dict[Path, tuple[bytes, int]]:
    """Every file under a model folder with its bytes and modification time (a shipped folder
    may hold transparency/ already, with the same texts: what matters is that nothing in it is
    written, even unchanged)."""
    return {p: (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("folder", DEFAULTS, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_hti1_has_the_31_attributes_each_answered_or_marked_with_why(folder: Path) -> None:
    doc = hti1(manifest(folder))
    attrs = doc["attributes"]
    assert [a["number"] for a in attrs] == list(range(1, 32))
    # the rule's nine paragraphs (B)(1)..(9) with 4, 4, 2, 4, 2, 4, 5, 4 and 2 attributes
    per = Counter(re.match(r"\(b\)\(11\)\(iv\)\(B\)\((\d)\)", a["paragraph"])[1] for a in attrs)
    assert [per[str(k)] for k in range(1, 10)] == [4, 4, 2, 4, 2, 4, 5, 4, 2]
    for a in attrs:
        assert a["attribute"] and a["category"], a
        if a["status"] == ANSWERED:
            assert a["answer"] and a["reason"] is None, a
        else:
            assert a["status"] in (NOT_APPLICABLE, NOT_REPORTED) and a["answer"] is None, a
            assert len(a["reason"]) > 20, a
    # the answers no manifest holds are said to be missing, not invented
    assert attrs[1]["status"] == NOT_REPORTED  # funding


def test_hti1_answers_come_from_the_manifest() -> None:
    mort, phen = manifest(MORTALITY), manifest(PHENOTYPES)
    m_attrs, p_attrs = hti1(mort)["attributes"], hti1(phen)["attributes"]
    # (4)(ii) demographic inputs: the ensemble reads age and sex; the phenotype LSTM none
    assert mort.encoder.uses_static and not phen.encoder.uses_static
    assert m_attrs[11]["answer"].startswith("Used: date of birth") and "sex" in m_attrs[11][
        "answer"]
    assert p_attrs[11]["answer"].startswith("None: the model reads no demographic input")
    # (7)(i) the test AUROC with its CI, as the manifest has it
    ci = mort.metrics["test_ci"]["auroc"]
    assert f"auroc {ci['value']:.3f} [{ci['low']:.3f}, {ci['high']:.3f}]" in m_attrs[20]["answer"]
    # (7)(ii) the fairness audit for mortality; the phenotype model has none, and says why
    assert "sex=female: AUROC" in m_attrs[21]["answer"]
    assert p_attrs[21]["status"] == NOT_REPORTED and "binary task only" in p_attrs[21]["reason"]
    # (4)(iii) the training split's age and sex from the manifest's static statistics
    assert f"mean age {mort.static['means'][0]:.1f} years" in m_attrs[12]["answer"]


@pytest.mark.parametrize("folder", SHIPPED, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_the_chai_card_of_every_shipped_model_validates_against_the_chai_schema(
        folder: Path) -> None:
    xml = chai_card_xml(manifest(folder))
    assert chai_card_errors(xml) == []
    assert f'xmlns="{CHAI_NS}"' in xml and "<ReleaseVersion>" + folder.name in xml


def test_a_broken_chai_card_fails_validation() -> None:
    """The check can fail: a card without its model summary, one with an element out of
    order, and one with an element the schema does not know are each refused."""
    xml = chai_card_xml(manifest(MORTALITY))
    no_summary = re.sub(r"<ModelSummary>.*?</ModelSummary>", "", xml, flags=re.S)
    assert any("ModelSummary" in e or "UsesAndDirections" in e
               for e in chai_card_errors(no_summary))
    basic = re.search(r"\s*<BasicInfo>.*?</BasicInfo>", xml, flags=re.S)[0]
    swapped = xml.replace(basic, "").replace("</ReleaseInfo>", "</ReleaseInfo>" + basic)
    assert chai_card_errors(swapped)
    extra = xml.replace("<Bibliography>", "<Comment>x</Comment><Bibliography>")
    assert chai_card_errors(extra)


@pytest.mark.parametrize("folder", DEFAULTS, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_tripod_ai_maps_every_item_to_sections_the_model_card_has(folder: Path) -> None:
    doc = tripod_ai(manifest(folder))
    items = doc["items"]
    assert len({re.match(r"\d+", i["item"])[0] for i in items}) == 27
    assert len(items) == 52
    card = (folder / "MODEL_CARD.md").read_text()
    headings = set(re.findall(r"^#{1,3} (.+)$", card, flags=re.M))
    for i in items:
        assert i["status"] in ("reported", "partly_reported", NOT_REPORTED, NOT_APPLICABLE), i
        assert i["note"], i
        if i["status"] in ("reported", "partly_reported"):
            assert i["where"], i
        for w in i["where"]:
            if "section" in w:
                assert w["section"] in headings, (i["item"], w["section"])
            else:
                assert w["manifest"].split(".")[0] in Manifest.model_fields, w


def test_the_markdown_rendering_has_a_row_per_attribute_and_item() -> None:
    m = manifest(MORTALITY)
    text = document_text("markdown", m)
    hti, tripod = text.split("## TRIPOD+AI checklist")
    assert len(re.findall(r"^\| \d+ \| \(b\)\(11\)", hti, flags=re.M)) == 31
    assert len(re.findall(r"^\| \d+[a-g]? \| ", tripod, flags=re.M)) == 52
    assert "| 2 | (b)(11)(iv)(B)(1)(ii) |" in hti and "not_reported" in hti


def test_documents_are_deterministic_text_of_their_builders() -> None:
    m = manifest(PHENOTYPES)
    for name in DOCUMENTS:
        assert document_text(name, m) == document_text(name, m)
    assert json.loads(document_text("hti1", m)) == hti1(m)
    assert json.loads(document_text("tripod-ai", m)) == tripod_ai(m)


def test_the_command_summarizes_validates_and_writes_outside_the_model(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from scehr.schemas.transparency import main

    before = folder_files(MORTALITY)
    assert main([str(MORTALITY), "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    m = manifest(MORTALITY)
    assert "hti1: answered" in printed and "chai-model-card: valid against" in printed
    for name, (_, _, file) in DOCUMENTS.items():
        written = tmp_path / m.task / m.version / "transparency" / file
        assert written.read_text() == document_text(name, m)
    assert folder_files(MORTALITY) == before  # the shipped folder is untouched
