"""The apps scehr is compared with run the same preprocessing and give the same risks."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from scehr.schemas.payloads import StayPayload
from scehr.schemas.tasks import TASK_NAMES, task_spec
from scehr.service.model_store import read_index
from scehr.service.pipeline import prepare
from scehr.service.registry import load_model, resolve
from scehr.service.responses import predictions
from scehr.service.settings import Settings
from tests.service.conftest import stay
from tests.service.fixture_model import write_model_dir

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("models"))


def reference(models: Path, task: str, payloads: list[dict]) -> list[list[float]]:
    m = load_model(resolve(models, read_index(models), task), task,
                   Settings(model_dir=models, device="cpu"))
    out = []
    for p in payloads:
        prep = prepare(m.spec, [StayPayload.model_validate(p)])
        out.append([c.risk for c in predictions(m.spec, prep, m.run(prep.inputs))[0].results])
    return out


PAYLOADS = [stay(), stay(hours=(2.0, 30.0), hr=120.0), stay(hours=(5.0,), hr=60.0)]


@pytest.mark.parametrize("session", ["default", "tuned"])
@pytest.mark.parametrize("task", [t for t in TASK_NAMES if not task_spec(t).landmarks])
async def test_plain_fastapi_app_returns_only_the_service_pipelines_risks(
        models: Path, task: str, session: str) -> None:
    from alternatives.plain_fastapi import build, load

    app = build(load(models, task, session))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as c:
        replies = [(await c.post("/predict", json=p)).json() for p in PAYLOADS]
        assert (await c.post("/predict", json={"x": 1})).status_code == 422
        assert (await c.get("/health")).json() == {"status": "ok"}
    assert all(set(r) == {"risk"} for r in replies)  # what such an app returns, nothing more
    np.testing.assert_allclose([r["risk"] for r in replies], reference(models, task, PAYLOADS),
                               atol=1e-6)


@pytest.mark.parametrize("max_batch_size", [1, 8])  # LitServe's default, and batching on
def test_litserve_app_gives_the_same_risks(models: Path, max_batch_size: int) -> None:
    """decode -> (batch, padding to the longest stay) -> predict -> (unbatch) -> encode, as
    LitServe calls them, equals scoring each stay alone."""
    from alternatives.litserve_app import ScehrAPI

    api = ScehrAPI(models, "phenotypes", max_batch_size=max_batch_size)
    api.setup("cpu")
    preps = [api.decode_request(p) for p in PAYLOADS]
    if max_batch_size == 1:
        encoded = [api.encode_response(api.predict(p)) for p in preps]
    else:
        encoded = [api.encode_response(o) for o in api.unbatch(api.predict(api.batch(preps)))]
    np.testing.assert_allclose([e["risk"] for e in encoded],
                               reference(models, "phenotypes", PAYLOADS), atol=1e-6)
