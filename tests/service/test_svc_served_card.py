"""The default phenotypes model's card speaks of the risk the service serves: its eICU test
split (converted from the raw demo as the model's training data was) scored through HTTP gives
the card's headline figures on the served `risk`, within 0.005 of the uncalibrated `score`'s,
the calibration costs no class any ranking, and the served outcome sets cover, pooled over the
classes served at a level, within 2 points of that level.

Needs ../shared/data (skipped without it); converts the eICU demo into a temporary folder.
"""

from __future__ import annotations

import csv
from pathlib import Path

import httpx
import numpy as np
import pytest

from scehr.schemas.manifest import load_manifest
from scehr.schemas.model_index import read_index
from scehr.service.offline_scoring import read_benchmark
from scehr.service.settings import Settings
from scehr.training.metrics import macro_auroc, micro_auroc
from tests.conftest import SHARED_DATA, needs_shared_data
from tests.service.conftest import serve

pytestmark = [needs_shared_data, pytest.mark.anyio]
MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.fixture(scope="module")
def test_split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from scehr.training.data.eicu_demo import convert_eicu_demo

    out = tmp_path_factory.mktemp("eicu") / "eicu-benchmark"
    convert_eicu_demo(SHARED_DATA / "eicu-demo", out, progress=False)
    return out / "phenotyping" / "test"


async def served(split: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                        np.ndarray]:
    """(labels, risk, score, level, covered) [N, 25] of the split's stays, every one scored
    through the batch route of the default phenotypes model (the minimum lifted: the card
    covers all stays); `covered`: the stay's outcome is in its served outcome set."""
    with open(split / "listfile.csv", newline="") as f:
        rows = {r["stay"]: r for r in csv.DictReader(f)}
    stays = [(stay, payload) for stay, payload, _ in read_benchmark(split)]
    labels = None
    y, risk, score, level, sets = [], [], [], [], []
    settings = Settings(model_dir=MODELS, device="cpu", tasks=["phenotypes"])
    async with serve(settings) as client:
        client: httpx.AsyncClient
        for a in range(0, len(stays), 64):
            part = stays[a:a + 64]
            r = await client.post("/predict/phenotypes/batch",
                                  params={"allow_insufficient": "true"},
                                  json={"stays": [p for _, p in part]})
            assert r.status_code == 200, r.text
            for (stay, _), item in zip(part, r.json()["items"], strict=True):
                results = item["prediction"]["results"]
                labels = labels or [c["label"] for c in results]
                y.append([float(rows[stay][name]) for name in labels])
                risk.append([c["risk"] for c in results])
                score.append([c["score"] for c in results])
                level.append([c["risk_interval"]["level"] for c in results])
                sets.append([c["risk_interval"]["outcomes"] for c in results])
    yy = np.array(y)
    covered = np.array([[("outcome" if yy[i, c] else "no_outcome") in sets[i][c]
                         for c in range(yy.shape[1])] for i in range(len(yy))])
    return yy, np.array(risk), np.array(score), np.array(level), covered


async def test_the_card_headline_is_the_served_risks(test_split: Path) -> None:
    index = read_index(MODELS)
    folder = MODELS / index.entry("phenotypes", index.defaults["phenotypes"]).path
    m = load_manifest(folder / "manifest.json")
    y, risk, score, level, covered = await served(test_split)
    assert len(y) == m.provenance.splits["test"].n
    got = {"micro_auroc": micro_auroc(y, risk), "macro_auroc": macro_auroc(y, risk)}
    print({k: round(v, 4) for k, v in got.items()},
          {"score_micro": round(micro_auroc(y, score), 4),
           "score_macro": round(macro_auroc(y, score), 4)})
    for name, value in got.items():
        assert m.metrics["test"][name] == pytest.approx(value, abs=1e-3), name
        assert m.metrics["test_ci"][name]["value"] == pytest.approx(value, abs=1e-3), name
    assert abs(got["micro_auroc"] - micro_auroc(y, score)) <= 0.005
    assert abs(got["macro_auroc"] - macro_auroc(y, score)) <= 0.005
    card = (folder / "MODEL_CARD.md").read_text()
    assert "Computed on the served `risk`" in card
    for c in range(y.shape[1]):  # a monotone map never ties scores that differ
        order = np.argsort(score[:, c], kind="stable")
        distinct = np.diff(score[order, c]) > 0
        assert np.all(np.diff(risk[order, c])[distinct] > 0), m.label_names[c]
    for at in np.unique(level):  # per served level, pooled over its classes
        share = covered[level == at].mean()
        print(f"served at {at:.0%}: {int((level[0] == at).sum())} classes, coverage {share:.1%}")
        assert abs(share - at) <= 0.02, (at, share)
