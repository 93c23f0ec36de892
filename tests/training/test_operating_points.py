"""Operating points validation can defend: never at the risk floor, never alerting for most
stays, none for a class with too few validation positives; each withheld point says why."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from scehr.schemas.manifest import load_manifest
from scehr.training.operating_points import MAX_ALERT_RATE, defensible_points, risk_levels
from scehr.training.reissue import rescreen, validation_positives

MODELS = Path(__file__).resolve().parents[2] / "models"


def test_the_shipped_floor_thresholds_are_withheld_with_their_reason() -> None:
    m = load_manifest(MODELS / "phenotypes" / "1.1.0" / "manifest.json")
    cards = {c.label: rescreen(c, validation_positives(m, i)) for i, c in enumerate(m.classes)}
    ami = cards["Acute myocardial infarction"]
    assert "high_sensitivity" not in [p.name for p in ami.named_points]
    [why] = [w.reason for w in ami.withheld_points if w.name == "high_sensitivity"]
    assert "risk floor" in why
    for card in cards.values():
        for p in card.named_points:
            assert 1e-4 < p.threshold < 1 - 1e-4
            assert p.validation.alert_rate <= MAX_ALERT_RATE, (card.label, p.name)
        if not card.named_points:
            assert card.default_operating_point is None and card.withheld_points
    rare = cards["Conduction disorders"]  # 3 of 223 validation stays
    assert not rare.named_points
    assert all("validation stay(s) with the outcome" in w.reason for w in rare.withheld_points)


def test_re_screening_a_re_issued_model_changes_no_point() -> None:
    """Points and withheld reasons stay; only the levels follow the current rule, and a second
    re-screen changes nothing."""
    m = load_manifest(MODELS / "phenotypes" / "1.1.1" / "manifest.json")
    for i, card in enumerate(m.classes):
        again = rescreen(card, validation_positives(m, i))
        assert again.model_copy(update={"levels": card.levels}) == card, card.label
        assert rescreen(again, validation_positives(m, i)) == again, card.label


def test_critical_is_the_most_specific_kept_point() -> None:
    """With ordered points, `critical` sits at high_ppv, not at the next point up (balanced):
    "critical" must fire for fewer patients than any other level."""
    rng = np.random.default_rng(1)
    y = (rng.random(3000) < 0.15).astype(int)
    risk = np.clip(0.15 + 0.3 * (y - 0.15) + rng.normal(0, 0.12, 3000), 1e-3, 0.999)
    kept, withheld = defensible_points((y, risk), None)
    assert [p.name for p in kept] == ["high_sensitivity", "balanced", "high_ppv"], withheld
    levels = risk_levels(kept, "high_sensitivity")
    assert levels is not None and levels.critical == "high_ppv"
    assert risk_levels(kept, "balanced").critical == "high_ppv"  # type: ignore[union-attr]
    assert risk_levels(kept, "high_ppv").critical is None  # type: ignore[union-attr]


def test_kept_points_keep_their_threshold_and_levels_are_named_points_on_the_risk() -> None:
    m = load_manifest(MODELS / "mortality" / "1.2.0" / "manifest.json")
    card = rescreen(m.classes[0], validation_positives(m, 0))
    assert card.named_points == m.classes[0].named_points
    assert card.levels is not None and card.levels.warning == "high_sensitivity"
    by = {p.name: p.threshold for p in card.named_points}
    assert card.levels.critical is not None
    assert by[card.levels.critical] > by[card.levels.warning]


def test_defensible_points_on_a_label_everyone_scores_alike() -> None:
    rng = np.random.default_rng(0)
    y = (rng.random(400) < 0.2).astype(int)
    risk = np.where(rng.random(400) < 0.9, 1e-4, rng.random(400))  # mostly at the floor
    kept, withheld = defensible_points((y, risk), None)
    assert all(p.validation.alert_rate <= MAX_ALERT_RATE for p in kept)
    assert {w.name for w in withheld} | {p.name for p in kept} == {
        "high_sensitivity", "balanced", "high_ppv"}
    assert risk_levels([], None) is None
