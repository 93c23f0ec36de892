"""The shipped models' answers to the example payloads do not move under refactoring.

One golden file per shipped version (`golden/served_examples-<version>.json`), recorded from
the served responses of that version (see `record` below:
`python -m tests.service.test_svc_served_outputs_frozen VERSION`). Each version is served on
its own from a copy of `models/` whose index makes it the default, so changing the shipped
default does not change what is compared. Only numbers are compared, per class, to 1e-6; if
the response renames a field, change `FIELDS`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from scehr.schemas.model_index import ModelIndex, read_index, write_index
from scehr.schemas.tasks import TASK_NAMES
from scehr.service.settings import Settings
from tests.service.conftest import serve

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]
GOLDEN_DIR = Path(__file__).parent / "golden"

#: Recorded name -> where the current response keeps that number (per class result).
FIELDS = {"probability": "score", "calibrated_probability": "risk"}
#: The example each feature set's models answer (examples/): a model is sent stays it reads.
EXAMPLE_OF = {"benchmark76-48h": "mortality_stay_benchmark17.json",
              "physionet2012-full": "mortality_stay.json",
              "benchmark76-stay": "phenotypes_stay.json"}


def golden(version: str) -> Path:
    return GOLDEN_DIR / f"served_examples-{version}.json"


def recorded_versions() -> list[str]:
    return sorted(p.stem.removeprefix("served_examples-")
                  for p in GOLDEN_DIR.glob("served_examples-*.json"))


def models_with_default(version: str, into: Path) -> Path:
    """A model dir holding only `version` of each task, as every task's default."""
    shipped = read_index(REPO / "models")
    entries = [e for e in shipped.models if e.version == version]
    for e in entries:
        shutil.copytree(REPO / "models" / e.path, into / e.path)
    write_index(into, ModelIndex(defaults={e.task: version for e in entries}, models=entries))
    return into


def tasks_of(version: str) -> list[str]:
    return [e.task for e in read_index(REPO / "models").models if e.version == version]


async def served(task: str, model_dir: Path) -> list[dict[str, Any]]:
    """Per class: label and the numbers of FIELDS, from /predict on the model dir's default."""
    [entry] = [e for e in read_index(model_dir).models if e.task == task]
    payload = json.loads((REPO / "examples" / EXAMPLE_OF[entry.feature_set]).read_text())
    # legacy versions too: served on request (SCEHR_ALLOW_LEGACY_MODELS), they must not move
    async with serve(Settings(model_dir=model_dir, device="cpu",
                              allow_legacy_models=True)) as client:
        r = await client.post(f"/predict/{task}", json=payload)
    assert r.status_code == 200, r.text
    return [{"label": c["label"], **{k: c[v] for k, v in FIELDS.items()}}
            for c in r.json()["results"]]


def test_every_shipped_version_has_a_golden_file() -> None:
    shipped = {e.version for e in read_index(REPO / "models").models}
    assert shipped <= set(recorded_versions()), "record the new version's golden file"


@pytest.mark.parametrize(("version", "task"), [(v, t) for v in recorded_versions()
                                                for t in TASK_NAMES if t in tasks_of(v)])
async def test_served_probabilities_of_the_examples_did_not_move(
        task: str, version: str, tmp_path: Path) -> None:
    want = json.loads(golden(version).read_text())[task]
    got = await served(task, models_with_default(version, tmp_path))
    assert [c["label"] for c in got] == [c["label"] for c in want]
    for g, w in zip(got, want, strict=True):
        for k in FIELDS:
            assert g[k] == pytest.approx(w[k], abs=1e-6), (task, version, g["label"], k)


def record(version: str, scratch: Path) -> None:
    """Write `version`'s golden file from the current code (only on a known-good revision)."""
    model_dir = models_with_default(version, scratch)
    out = {task: asyncio.run(served(task, model_dir)) for task in tasks_of(version)}
    golden(version).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        record(sys.argv[1], Path(d))
