"""A tiny real landmark model (trained and exported by the training package) served as a
trajectory: the hour-48 risk is the full stay's, each hour is the graph's own step, and later
data never changes an earlier hour, through HTTP."""

from __future__ import annotations

import csv
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from scehr.schemas.contract import PROBABILITY_BY_HOUR
from scehr.schemas.manifest import load_manifest
from scehr.schemas.payloads import StayPayload
from scehr.service.offline_scoring import benchmark_payload
from scehr.service.pipeline import prepare as pipeline_prepare
from scehr.service.registry import load_model
from scehr.service.settings import Settings
from scehr.training.config import TrainConfig
from tests.service.conftest import serve

pytestmark = pytest.mark.anyio
ROUTE = "/predict/mortality/trajectory"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def client(landmark: tuple[Path, TrainConfig]) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(Settings(model_dir=landmark[0], device="cpu")) as c:
        yield c


def long_stays(cfg: TrainConfig, k: int = 3) -> list[Path]:
    """The first `k` test stays of the synthetic data with 48 h of rows."""
    split = Path(cfg.data) / "in-hospital-mortality" / "test"
    out = []
    with open(split / "listfile.csv") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        path = split / row["stay"]
        with open(path) as f:
            if float(list(csv.DictReader(f))[-1]["Hours"]) > 47.0:
                out.append(path)
        if len(out) == k:
            return out
    raise AssertionError("no 48-hour test stays")


def changed_after(payload: dict[str, Any], hour: float) -> dict[str, Any]:
    """The stay with every numeric value after `hour` changed (+25 %)."""
    wide = payload["wide"]
    cols = {name: [v * 1.25 if isinstance(v, float) and t > hour else v
                   for v, t in zip(values, wide["hours"], strict=True)]
            for name, values in wide["columns"].items()}
    return {**payload, "wide": {**wide, "columns": cols}}


async def test_the_served_hours_are_the_graphs_steps_and_hour_48_the_full_stay(
        client: httpx.AsyncClient, landmark: tuple[Path, TrainConfig]) -> None:
    models, cfg = landmark
    (folder,) = (models / "mortality-landmark").iterdir()
    m = load_manifest(folder / "manifest.json")
    assert m.trajectory is not None
    last_band = m.trajectory.bands[-1]
    for path in long_stays(cfg):
        payload = benchmark_payload(path, end_hours=48.0)
        r = await client.post(ROUTE, json=payload)
        assert r.status_code == 200, r.text
        hours = r.json()["hours"]
        assert [h["hour"] for h in hours] == list(range(1, 49))
        full = (await client.post("/predict/mortality-landmark", json=payload)).json()
        assert full["status"] == "scored"
        res = full["results"][0]
        assert hours[-1]["score"] == pytest.approx(res["score"], abs=1e-6)
        expected = last_band.calibration.apply(np.array([res["score"]]),
                                               np.array([res["explanation"]["margin"]]))
        if hours[-1]["status"] == "scored":
            assert hours[-1]["risk"] == pytest.approx(float(expected[0]), abs=1e-6)
    # hour h is the graph's step h-1 of the stay's tensor, from one run
    model = load_model(folder, "mortality-landmark", Settings(model_dir=models, device="cpu"))
    prep = pipeline_prepare(model.spec, [StayPayload.model_validate(payload)])
    assert prep.inputs is not None
    session = ort.InferenceSession(str(folder / "model.onnx"))
    by_hour = session.run([PROBABILITY_BY_HOUR.name], model.feeds(prep.inputs))[0]
    scored = [h for h in hours if h["status"] == "scored"]
    assert scored and all(h["hour"] >= m.trajectory.first_hour for h in scored)
    np.testing.assert_allclose([h["score"] for h in scored],
                               [by_hour[0, h["hour"] - 1, 0] for h in scored], atol=1e-6)


async def test_later_values_changed_leave_the_earlier_hours_as_they_were(
        client: httpx.AsyncClient, landmark: tuple[Path, TrainConfig]) -> None:
    for path in long_stays(landmark[1]):
        payload = benchmark_payload(path, end_hours=48.0)
        base = (await client.post(ROUTE, json=payload)).json()["hours"]
        later = (await client.post(ROUTE, json=changed_after(payload, 24.0))).json()["hours"]
        assert later[:24] == base[:24]  # risk, score, interval, status, reasons, alert
        assert [h["score"] for h in later[24:]] != [h["score"] for h in base[24:]]


async def test_each_band_minimum_is_chosen_on_validation_and_served_as_the_export_counts_it(
        client: httpx.AsyncClient, landmark: tuple[Path, TrainConfig]) -> None:
    from scehr.training.data.reader import read_timeseries
    from scehr.training.landmark_assets import below_minimum, held_by_hour

    models, cfg = landmark
    (folder,) = (models / "mortality-landmark").iterdir()
    m = load_manifest(folder / "manifest.json")
    assert m.trajectory is not None
    for b in m.trajectory.bands:
        d = b.data_minimum
        assert d is not None and d.validation is not None and d.validation.n > 0
        assert f"truncated at hour {b.from_hour}, the first of the band {b.from_hour}-" in d.rule
    fs = load_model(folder, "mortality-landmark",
                    Settings(model_dir=models, device="cpu")).spec.fs
    for path in long_stays(cfg):
        obs, _ = read_timeseries([path], fs, progress=False)
        below = below_minimum(m.trajectory, held_by_hour(obs, 1, 48, fs))[0]
        hours = (await client.post(ROUTE, json=benchmark_payload(path, end_hours=48.0))
                 ).json()["hours"]
        served_below = [h["status"] == "abstained"
                        and h["reasons"][0]["code"] == "below_data_minimum" for h in hours]
        assert served_below == below.tolist()
