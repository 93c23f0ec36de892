"""The shipped models' answers to the example payloads do not move under refactoring.

The expected values were recorded from the served responses before the architecture work of
issue 8 (see `record` below: `python -m tests.service.test_svc_served_outputs_frozen`). Only
numbers are compared, per class, to 1e-6; if the response renames a field, change `FIELDS`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from service.settings import Settings
from tests.service.conftest import serve

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden" / "served_examples.json"
TASKS = ("mortality", "phenotypes")

#: Recorded name -> where the current response keeps that number (per class result).
FIELDS = {"probability": "probability", "calibrated_probability": "calibrated_probability"}


async def served(task: str) -> list[dict[str, Any]]:
    """Per class: label and the numbers of FIELDS, from /predict on the shipped default."""
    payload = json.loads((REPO / "examples" / f"{task}_stay.json").read_text())
    async with serve(Settings(model_dir=REPO / "models", device="cpu")) as client:
        r = await client.post(f"/predict/{task}", json=payload)
    assert r.status_code == 200, r.text
    return [{"label": c["label"], **{k: c[v] for k, v in FIELDS.items()}}
            for c in r.json()["results"]]


@pytest.mark.parametrize("task", TASKS)
async def test_served_probabilities_of_the_examples_did_not_move(task: str) -> None:
    want = json.loads(GOLDEN.read_text())[task]
    got = await served(task)
    assert [c["label"] for c in got] == [c["label"] for c in want]
    for g, w in zip(got, want, strict=True):
        for k in FIELDS:
            assert g[k] == pytest.approx(w[k], abs=1e-6), (task, g["label"], k)


def record() -> None:
    """Write the golden file from the current code (run only on a known-good revision)."""
    out = {task: asyncio.run(served(task)) for task in TASKS}
    GOLDEN.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    record()
