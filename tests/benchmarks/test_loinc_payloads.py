"""The benchmarks' LOINC-coded long-form payloads are the same stays as the wide ones: scehr, the
plain FastAPI app and the LitServe app give each stay the same risks in either form.

The stays are converted from the open PhysioNet 2012 data in the shared data folder (the first
records of each set, in the default mortality model's feature set); skipped when it is absent.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import needs_shared_data
from tests.service.test_svc_prepare_frozen import convert

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
sys.path.insert(0, str(REPO / "benchmarks"))

pytestmark = [needs_shared_data, pytest.mark.anyio]


@pytest.fixture(scope="module")
def both_forms(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], list[dict]]:
    """Twelve real set-C stays, wide and LOINC-coded long form."""
    from payloads import loinc_payload, real_stays

    found = real_stays("mortality", 12, MODELS, convert(tmp_path_factory.mktemp("data")))
    assert found is not None and len(found[0]) == 12
    return found[0], [loinc_payload(s) for s in found[0]]


def scehr_risks(payloads: list[dict]) -> list[list[float] | None]:
    from scehr.schemas.payloads import StayPayload
    from scehr.service.pipeline import prepare
    from scehr.service.registry import load_model, read_index, resolve
    from scehr.service.responses import predictions
    from scehr.service.settings import Settings

    m = load_model(resolve(MODELS, read_index(MODELS), "mortality"), "mortality",
                   Settings(model_dir=MODELS, device="cpu", intra_op_threads=1))
    out: list[list[float] | None] = []
    for p in payloads:
        prep = prepare(m.spec, [StayPayload.model_validate(p)])
        assert prep.ok, prep.problems
        res = predictions(m.spec, prep, m.run(prep.inputs))[0]
        out.append([c.risk for c in res.results] if res.results else None)
    return out


def test_the_loinc_form_names_each_measurement_as_an_ehr_does(
        both_forms: tuple[list[dict], list[dict]]) -> None:
    from scehr.schemas.variables import CATALOG

    wide, loinc = both_forms
    codes = {v.loinc for v in CATALOG if v.loinc}
    for w, long in zip(wide, loinc, strict=True):
        assert "wide" not in long and long["demographics"] == w["demographics"]
        measured = sum(x is not None for col in w["wide"]["columns"].values() for x in col)
        assert len(long["observations"]) == measured
        times = [o["time"] for o in long["observations"]]
        assert times == sorted(times)
        assert sum(o["variable"] in codes for o in long["observations"]) > measured / 2
    size = np.mean([len(json.dumps(s, separators=(",", ":"))) for s in loinc])
    assert 15_000 < size < 60_000, size  # tens of kB per stay, as an EHR interface sends


def test_scehr_gives_the_same_risks_for_both_forms(
        both_forms: tuple[list[dict], list[dict]]) -> None:
    wide, loinc = both_forms
    a, b = scehr_risks(wide), scehr_risks(loinc)
    assert sum(r is not None for r in a) >= 6  # most stays meet the data minimum
    assert a == b


async def test_the_alternatives_accept_the_loinc_form(
        both_forms: tuple[list[dict], list[dict]]) -> None:
    from alternatives.litserve_app import ScehrAPI
    from alternatives.plain_fastapi import build, load

    wide, loinc = both_forms
    app = build(load(MODELS, "mortality", "tuned"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as c:
        fastapi = [[(await c.post("/predict", json=p)).json()["risk"] for p in form]
                   for form in (wide, loinc)]
    api = ScehrAPI(MODELS, "mortality", max_batch_size=1)
    api.setup("cpu")
    litserve = [[api.encode_response(api.predict(api.decode_request(p)))["risk"] for p in form]
                for form in (wide, loinc)]
    np.testing.assert_allclose(fastapi[1], fastapi[0], atol=1e-7)
    np.testing.assert_allclose(litserve[1], litserve[0], atol=1e-7)
    np.testing.assert_allclose(litserve[1], fastapi[1], atol=1e-6)
