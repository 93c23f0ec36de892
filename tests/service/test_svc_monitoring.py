"""Drift monitoring: fixed memory and series whatever the traffic; gauges move under drift."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from scehr.schemas.payloads import StayPayload
from scehr.schemas.profile import psi
from scehr.service import monitoring
from scehr.service.monitoring import ModelMonitor, Reference
from scehr.service.operating import PointTable
from scehr.service.pipeline import prepare
from scehr.service.settings import Settings
from tests.service.conftest import serve, stay
from tests.service.fixture_model import write_index, write_model

pytestmark = pytest.mark.anyio
WINDOW = 60


@pytest.fixture(scope="module")
def named_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("monitored")
    write_model(root, "mortality", "n1", loss="cbce", seed=1, named=True)
    write_index(root, [("mortality", "n1")])
    return root


def population(rng: np.random.Generator, n: int, hr_shift: float = 0.0,
               drop: str | None = None) -> list[dict[str, Any]]:
    """Distinct stays around the fixture's reference (normal value ± 15%, as its deciles say);
    `hr_shift` moves heart rate, `drop` stops measuring a variable."""
    stays = []
    for _ in range(n):
        obs = []
        for t in np.sort(rng.uniform(0, 47, size=12)).round(3).tolist():
            obs.append({"variable": "heart_rate", "time": t,
                        "value": round(float(rng.normal(86 + hr_shift, 12.9)), 2)})
            if drop != "respiratory_rate":
                obs.append({"variable": "respiratory_rate", "time": t,
                            "value": round(float(rng.normal(19, 2.85)), 2)})
        stays.append({"observations": obs})
    return stays


async def send(c: httpx.AsyncClient, stays: list[dict[str, Any]]) -> None:
    for i in range(0, len(stays), 50):
        r = await c.post("/predict/mortality/batch", json={"stays": stays[i : i + 50]})
        assert r.status_code == 200, r.text


def gauge(text: str, name: str, **labels: str) -> float:
    sel = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^{name}{{{re.escape(sel)}}} (\S+)$", text, re.M)
    assert m is not None, (name, labels)
    return float(m.group(1))


def series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.startswith("scehr_monitor_"))


async def test_memory_and_series_do_not_grow_and_gauges_move_under_drift(
        named_dir: Path) -> None:
    rng = np.random.default_rng(0)
    async with serve(Settings(model_dir=named_dir, device="cpu",
                              monitor_window=WINDOW)) as c:
        monitoring = c.app.state.monitoring  # type: ignore[attr-defined]
        await send(c, population(rng, WINDOW))
        [mon] = monitoring.monitors()
        size, text = mon.nbytes, (await c.get("/metrics")).text
        before = series(text)
        calm_psi = gauge(text, "scehr_monitor_value_psi", model="mortality",
                         variable="heart_rate")
        calm_rr = gauge(text, "scehr_monitor_observation_rate", model="mortality",
                        variable="respiratory_rate")
        assert gauge(text, "scehr_monitor_window_stays", model="mortality") == WINDOW
        assert calm_psi < 0.1 and calm_rr == 1.0
        # five windows of distinct stays, drifted: tachycardia, respiratory rate not charted
        await send(c, population(rng, 5 * WINDOW, hr_shift=40.0, drop="respiratory_rate"))
        text = (await c.get("/metrics")).text
        assert mon.nbytes == size and series(text) == before
        assert gauge(text, "scehr_monitor_window_stays", model="mortality") == WINDOW
        assert gauge(text, "scehr_monitor_value_psi", model="mortality",
                     variable="heart_rate") > 0.25
        assert gauge(text, "scehr_monitor_observation_rate", model="mortality",
                     variable="respiratory_rate") == 0.0
        assert gauge(text, "scehr_monitor_training_observation_rate", model="mortality",
                     variable="respiratory_rate") == pytest.approx(0.9)
        summary = (await c.get("/models/mortality/monitoring")).json()
    assert summary["stays"] == WINDOW and summary["window_size"] == WINDOW
    hr = next(v for v in summary["variables"] if v["variable"] == "heart_rate")
    assert hr["psi"] > 0.25 and 0 < hr["observed_hours"] <= 12 * WINDOW  # hourly cells
    alerts = {(a["label"], a["operating_point"]) for a in summary["alerts"]}
    assert alerts == {("in_hospital_mortality", p)
                      for p in ("high_sensitivity", "balanced", "high_ppv")}
    assert all(0 <= a["alert_rate"] <= 1 and a["validation_alert_rate"] is not None
               for a in summary["alerts"])
    assert summary["risk"][0]["psi"] is not None and summary["notes"] == []


async def test_monitoring_route_404s_for_an_unserved_task(named_dir: Path) -> None:
    async with serve(Settings(model_dir=named_dir, device="cpu")) as c:
        r = await c.get("/models/phenotypes/monitoring")
    assert r.status_code == 404


def test_psi_is_zero_on_the_reference_and_large_on_a_shift() -> None:
    ref = np.full(10, 0.1)
    assert psi(ref, np.full(10, 7)) == pytest.approx(0.0)
    assert psi(ref, np.array([0] * 8 + [50, 50])) > 1.0
    assert psi(ref, np.zeros(10)) is None


def _reference() -> Reference:
    return Reference(task="mortality", version="t", variables=("a", "b", "c"),
                     coverage=np.array([0.5, 0.9, np.nan]), bins=None, value_fractions=None,
                     n_value_bins=np.ones(3, dtype=np.int64), labels=("y",),
                     risk_edges=[np.array([0.2, 0.5])], risk_fractions=[np.array([0.3, 0.4, 0.3])],
                     points=("high_sensitivity",), validation_alert_rate=np.array([[0.2]]))


def _stays(rng: np.random.Generator, n: int) -> tuple[np.ndarray, None, np.ndarray, np.ndarray]:
    risk = rng.uniform(size=(n, 1))
    return rng.uniform(size=(n, 3)) < 0.6, None, risk, (risk > 0.4)[:, :, None]


@pytest.mark.parametrize("window", [7, 60])
def test_queued_stays_give_the_summary_of_stays_entered_one_by_one(
        window: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stays wait in a short queue before entering the window together; every reading lets
    them in first, so a summary is the one of a window that took each stay as it came."""
    rng = np.random.default_rng(3)
    queued, at_once = ModelMonitor(_reference(), window), ModelMonitor(_reference(), window)
    for k in range(150):
        stays = _stays(rng, int(rng.integers(1, 4)))
        queued.observe(*stays)
        monkeypatch.setattr(monitoring, "PENDING_ROWS", 1)  # the window takes it at once
        at_once.observe(*stays)
        monkeypatch.undo()
        assert queued._pending_rows < monitoring.PENDING_ROWS  # bounded whatever the traffic
        if k % 37 == 5:  # readings in between
            a, b = queued.summary().model_dump(), at_once.summary().model_dump()
            assert a["risk"][0].pop("mean_risk") == pytest.approx(b["risk"][0].pop("mean_risk"))
            assert a == b
    a, b = queued.summary().model_dump(), at_once.summary().model_dump()
    assert a["stays"] == window
    assert a["risk"][0].pop("mean_risk") == pytest.approx(b["risk"][0].pop("mean_risk"))
    assert a == b


def test_alerts_of_every_point_follow_each_class_threshold_and_value() -> None:
    """The monitor's [n, C, P] alerts: at or above the point's threshold, on the score where
    the point says so, else on the risk; never where a class lacks the point."""
    thresholds = np.array([[0.3, np.nan], [0.6, 0.5]])  # [P, C]
    table = PointTable(("a", "b"), thresholds, np.array([[False, False], [True, False]]),
                       thresholds, np.zeros(2, dtype=np.int64), False)
    risk = np.array([[0.3, 0.9], [0.29, 0.5], [np.nan, 0.49]])
    score = np.array([[0.59, 0.0], [0.6, 0.0], [0.7, 1.0]])
    got = table.alerts_of_every_point(risk, score)
    assert got.dtype == bool and got.shape == (3, 2, 2)
    assert got[:, 0, 0].tolist() == [True, False, False]  # class 0, point a: risk >= 0.3
    assert got[:, 0, 1].tolist() == [False, True, True]  # class 0, point b: score >= 0.6
    assert not got[:, 1, 0].any()  # class 1 lacks point a
    assert got[:, 1, 1].tolist() == [True, True, False]  # class 1, point b: risk >= 0.5
    # the cached bounds give the same again
    assert (table.alerts_of_every_point(risk, score) == got).all()


def _v2_tensors(spec: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """A V2 request of the graph's own tensors (what `prepare` makes of `payload`)."""
    prep = prepare(spec, [StayPayload.model_validate(payload)])
    assert prep.inputs is not None
    inputs = []
    for name, arr in (("x", prep.inputs.x), ("lengths", prep.inputs.lengths),
                      ("static", prep.inputs.static)):
        if arr is not None:
            inputs.append({"name": name, "shape": list(arr.shape),
                           "datatype": "FP32" if arr.dtype == np.float32 else "INT64",
                           "data": arr.ravel().tolist()})
    return {"inputs": inputs}


@pytest.mark.parametrize("order", [("json", "tensors"), ("tensors", "json")])
async def test_a_stay_without_values_queued_beside_one_with_them(
        named_dir: Path, order: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A raw-tensor V2 request brings no value counts (normalized values cannot be binned),
    a JSON stay does: queued together they enter the window as each would alone (the mix
    once ended in a 500 of whichever request or reading let the queue in, and the other order
    dropped the JSON stay's values)."""
    monkeypatch.setattr(monitoring, "REFRESH_SECONDS", 1e12)  # nothing enters until read
    payload = stay()
    async with serve(Settings(model_dir=named_dir, device="cpu")) as c:
        spec = c.app.state.registry.get("mortality").model.spec  # type: ignore[attr-defined]
        tensors = _v2_tensors(spec, payload)

        async def hours() -> int:
            r = await c.get("/models/mortality/monitoring")
            assert r.status_code == 200, r.text
            return sum(v["observed_hours"] for v in r.json()["variables"])

        assert (await c.post("/predict/mortality", json=payload)).status_code == 200
        alone = await hours()
        assert alone > 0
        for kind in order:
            r = await (c.post("/predict/mortality", json=payload) if kind == "json" else
                       c.post("/v2/models/mortality/infer", json=tensors))
            assert r.status_code == 200, r.text
        [mon] = c.app.state.monitoring.monitors()  # type: ignore[attr-defined]
        assert mon._pending_rows == 2  # both queued, neither in the window yet
        assert await hours() == 2 * alone
        r = await c.get("/models/mortality/monitoring")
        assert r.json()["stays"] == 3
