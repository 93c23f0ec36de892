"""The default models shipped in models/ load, warm up and score the example payloads.

This is what `./scripts/serve` serves on a fresh machine, so it is tested as shipped.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from scehr.schemas.manifest import load_manifest, sha256_file
from scehr.schemas.tasks import TASK_NAMES
from scehr.service.settings import Settings
from tests.service.conftest import serve

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
INDEX = json.loads((MODELS / "index.json").read_text())


def test_every_task_has_a_shipped_default_with_card_and_valid_manifest() -> None:
    assert set(INDEX["defaults"]) == set(TASK_NAMES)
    for entry in INDEX["models"]:
        folder = MODELS / entry["path"]
        m = load_manifest(folder / "manifest.json")
        assert m.task == entry["task"] and m.version == entry["version"]
        assert m.onnx.sha256 == sha256_file(folder / "model.onnx")
        assert (folder / "MODEL_CARD.md").is_file()
        assert m.metrics["test_ci"], "shipped models report test metrics with CIs"
        assert (folder / "model.onnx").stat().st_size < 2_000_000, "keep artifacts small"


@pytest.mark.parametrize("task", ["mortality", "phenotypes"])
async def test_shipped_default_scores_the_example(task: str) -> None:
    payload = json.loads((REPO / "examples" / f"{task}_stay.json").read_text())
    async with serve(Settings(model_dir=MODELS, device="cpu")) as client:
        r: httpx.Response = await client.post(f"/predict/{task}", json=payload)
        models = (await client.get(f"/models/{task}")).json()
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"]["version"] == INDEX["defaults"][task]
    n = 1 if task == "mortality" else 25
    assert len(body["results"]) == n
    for c in body["results"]:
        assert 0.0 <= c["score"] <= 1.0 and 0.0 <= c["risk"] <= 1.0
        e = c["explanation"]
        assert e["nearer_anchor"] == ("positive" if e["margin"] > 0 else "negative")
        ri = c["risk_interval"]  # the defaults serve the risk's uncertainty
        assert ri is not None and 0.0 <= ri["low"] <= ri["high"] <= 1.0
    assert "provider" in json.dumps(models) and models["uncertainty"] is True



async def test_the_shipped_landmark_default_gives_the_example_its_risk_at_every_hour() -> None:
    """The mortality example through the trajectory route of the shipped landmark model: one
    entry per hour up to 48, hours before the first landmark abstained, each scored hour with
    its band's interval, and the last hour the whole-stay route's score."""
    payload = json.loads((REPO / "examples" / "mortality_stay.json").read_text())
    async with serve(Settings(model_dir=MODELS, device="cpu")) as client:
        r = await client.post("/predict/mortality/trajectory", json=payload)
        whole = (await client.post("/predict/mortality-landmark", json=payload)).json()
    assert r.status_code == 200, r.text
    traj = r.json()
    m = load_manifest(MODELS / "mortality-landmark" / INDEX["defaults"]["mortality-landmark"]
                      / "manifest.json")
    assert traj["model"]["version"] == m.version
    hours = traj["hours"]
    assert [h["hour"] for h in hours] == list(range(1, len(hours) + 1)) and len(hours) <= 48
    first = m.trajectory.first_hour
    assert all(h["status"] == "abstained" for h in hours[:first - 1])
    scored = [h for h in hours if h["status"] == "scored"]
    assert scored, "the example has enough data for some hour"
    for h in scored:
        assert h["interval"]["low"] <= h["risk"] <= h["interval"]["high"]
    assert hours[-1]["score"] == pytest.approx(whole["results"][0]["score"], abs=1e-6)

def test_the_default_mortality_points_mean_their_names() -> None:
    """Thresholds and validation PPV rise from high_sensitivity through balanced to high_ppv
    (and test alert rates fall), so `critical`, at high_ppv, fires for the fewest stays."""
    m = load_manifest(MODELS / "mortality" / INDEX["defaults"]["mortality"] / "manifest.json")
    card = m.classes[0]
    points = {p.name: p for p in card.named_points}
    assert list(points) == ["high_sensitivity", "balanced", "high_ppv"]
    ordered = list(points.values())
    assert [p.threshold for p in ordered] == sorted(p.threshold for p in ordered)
    assert [p.validation.ppv for p in ordered] == sorted(p.validation.ppv for p in ordered)
    test_alerts = [p.test.alert_rate for p in ordered if p.test is not None]
    assert test_alerts == sorted(test_alerts, reverse=True) and len(test_alerts) == 3
    assert card.levels is not None
    assert (card.levels.warning, card.levels.critical) == ("high_sensitivity", "high_ppv")


@pytest.mark.parametrize("task", sorted(INDEX["defaults"]))
def test_every_default_class_orders_its_points(task: str) -> None:
    """In every class of every default model, the served points' thresholds and validation
    PPV rise in the names' order, and `critical` is the most specific served point."""
    m = load_manifest(MODELS / task / INDEX["defaults"][task] / "manifest.json")
    order = ("high_sensitivity", "balanced", "high_ppv")
    for card in m.classes:
        points = sorted(card.named_points, key=lambda p: order.index(p.name))
        assert [p.threshold for p in points] == sorted(p.threshold for p in points), card.label
        ppv = [p.validation.ppv for p in points]
        assert ppv == sorted(ppv), card.label
        if card.levels is not None and card.levels.critical is not None:
            assert card.levels.critical == points[-1].name, card.label
