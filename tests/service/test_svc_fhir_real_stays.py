"""Real PhysioNet 2012 set-c stays through the FHIR route: each stay sent as long-form JSON
and as the Bundle a hospital would send of the same observations gets the same risk (or the
same abstention), and every FHIR answer is one `fhir.resources` reads as valid FHIR R4 and
writes back unchanged. Needs the real data (../shared/data); skipped, and says so, without."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scehr.schemas.featureset import FEATURE_SETS
from scehr.schemas.model_index import read_index
from scehr.service.offline_scoring import read_benchmark
from scehr.service.settings import Settings
from tests.conftest import REPO, SHARED_DATA, needs_shared_data
from tests.service.conftest import serve
from tests.service.fhir_writer import bundle_of_stay, long_from_wide
from tests.service.test_svc_fhir_out import round_trip

pytestmark = [pytest.mark.anyio, needs_shared_data]
MODELS = REPO / "models"


def set_c_stays(out: Path, n: int) -> list[dict[str, Any]]:
    """The first `n` set-c stays, converted in the default mortality model's feature set,
    as wide-form JSON stays."""
    from scehr.training.data.physionet2012 import convert_physionet2012

    index = read_index(MODELS)
    default = index.entry("mortality", index.defaults["mortality"])
    assert default is not None
    convert_physionet2012(SHARED_DATA / "physionet2012", out, limit=n, progress=False,
                          fs=FEATURE_SETS[default.feature_set])
    return [p for _, p, _ in read_benchmark(out / "in-hospital-mortality" / "test")]


def fhir_risks(answer: dict[str, Any]) -> list[float]:
    return [e["resource"]["prediction"][0]["probabilityDecimal"] for e in answer["entry"]
            if e["resource"]["resourceType"] == "RiskAssessment"]


async def test_real_stays_get_the_same_risk_as_json_and_as_fhir(tmp_path: Path) -> None:
    stays = set_c_stays(tmp_path / "bench", 16)
    assert len(stays) == 16
    scored = 0
    async with serve(Settings(model_dir=MODELS, device="cpu", tasks=["mortality"])) as c:
        for wide in stays:
            stay = long_from_wide(wide)
            j = await c.post("/predict/mortality", json=stay)
            f = await c.post("/fhir/predict/mortality", json=bundle_of_stay(stay),
                             headers={"content-type": "application/fhir+json"})
            assert j.status_code == 200 and f.status_code == 200, (j.text, f.text)
            answer = f.json()
            assert round_trip(answer) == answer
            risks = [r["risk"] for r in j.json()["results"]]
            assert fhir_risks(answer) == risks  # the same stay: the same tensor, bit for bit
            scored += bool(risks)
    assert scored >= 12  # most real stays are above the data minimum
