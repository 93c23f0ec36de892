"""The service says which version is the default of each task and since when."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

import pytest

from scehr.schemas.model_index import set_default
from scehr.service.settings import Settings
from tests.service.conftest import serve
from tests.service.fixture_model import write_index, write_model

pytestmark = pytest.mark.anyio


async def test_models_metric_and_log_show_the_default_and_since_when(
        tmp_path: Path) -> None:
    for v in ("v1", "v2"):
        write_model(tmp_path, "mortality", v)
    write_index(tmp_path, [("mortality", "v1"), ("mortality", "v2")])
    set_default(tmp_path, "mortality", "v2")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("scehr.registry").addHandler(handler)
    try:
        async with serve(Settings(model_dir=tmp_path, device="cpu")) as client:
            body = (await client.get("/models")).json()
            metrics = (await client.get("/metrics")).text
    finally:
        logging.getLogger("scehr.registry").removeHandler(handler)
    info = body["models"][0]
    since = dt.datetime.fromisoformat(info["default_since"])
    assert info["version"] == info["default_version"] == "v2"
    assert dt.timedelta(0) <= dt.datetime.now(dt.UTC) - since < dt.timedelta(minutes=5)
    available = {a["version"]: a for a in body["available"]}
    assert available["v2"]["default"] and available["v2"]["default_since"] == info["default_since"]
    assert not available["v1"]["default"] and available["v1"]["default_since"] is None
    line = next(m for m in metrics.splitlines()
                if m.startswith("scehr_default_model_since_timestamp_seconds{"))
    assert 'task="mortality"' in line and 'version="v2"' in line
    assert float(line.split()[-1]) == pytest.approx(since.timestamp())
    rec = next(r for r in records if r.getMessage() == "default model")
    assert rec.default_version == "v2"  # type: ignore[attr-defined]
    assert dt.datetime.fromisoformat(rec.default_since) == since  # type: ignore[attr-defined]
