"""Fixture model dirs (torch-free) and an in-process ASGI client with the app's lifespan."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from scehr.service.app import create_app
from scehr.service.settings import Settings
from tests.service.fixture_model import write_model_dir


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("models"))


@pytest.fixture
def make_settings(model_dir: Path) -> Callable[..., Settings]:
    def make(**kw: Any) -> Settings:
        kw.setdefault("model_dir", model_dir)
        kw.setdefault("device", "cpu")
        return Settings(**kw)
    return make


async def wait_ready(client: httpx.AsyncClient, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if (await client.get("/readyz")).status_code == 200:
            return
        await asyncio.sleep(0.01)
    raise AssertionError((await client.get("/readyz")).json())


def wait_until_serving(proc: subprocess.Popen, base: str, output: Callable[[], str],
                       timeout: float = 60.0) -> None:
    """Poll a `scehr serve` process's /readyz until it answers 200; fail with the tail of its
    `output` when it exits first, or when it never gets ready (every process test starts one)."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, output()[-3000:]
        try:
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "server never became ready"
        time.sleep(0.1)


@asynccontextmanager
async def serve(settings: Settings, *, wait: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its lifespan running, behind an httpx client (app at `client.app`)."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            client.app = app  # type: ignore[attr-defined]
            if wait:
                await wait_ready(client)
            yield client


@pytest.fixture
async def client(make_settings: Callable[..., Settings]) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(make_settings()) as c:
        yield c


def stay(hours: tuple[float, ...] = (1.0, 12.0, 24.0, 47.0), hr: float = 90.0,
         **extra: Any) -> dict[str, Any]:
    """A small long-form stay; `hr` varies the heart rate so stays differ."""
    obs: list[dict[str, Any]] = []
    for k, t in enumerate(hours):
        obs += [
            {"variable": "heart_rate", "time": t, "value": hr + 3 * k, "unit": "bpm"},
            {"variable": "systolic_bp", "time": t, "value": 110 + k, "unit": "mmHg"},
            {"variable": "temperature", "time": t, "value": 37.0 + 0.1 * k, "unit": "Cel"},
            {"variable": "gcs_total", "time": t, "value": str(15 - k % 3)},
        ]
    obs.append({"variable": "glucose", "time": 2.0, "value": 140.0, "unit": "mg/dL"})
    return {"observations": obs, **extra}


def columns_read(s: Any) -> dict[str, Any]:
    """What a FHIR reading hands the scorer (a `scehr.schemas.ingest.ColumnStay`): the stay's fields
    and its observations row by row (each time with its UTC offset)."""
    cols = s.columns
    return {"id": s.id, "end_hours": s.end_hours, "admission": cols.admission,
            "demographics": None if s.demographics is None else s.demographics.model_dump(),
            "observations": [(v, (t, t.utcoffset()), x, u) for v, t, x, u in zip(
                cols.variable, cols.time, cols.value, cols.unit, strict=True)]}
