"""The exported model scored on another dataset, and the site recalibration that writes a new
model version the service serves, with its report against its parent (tiny synthetic model
and sites; the evaluation report itself: test_site_report.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scehr.schemas.manifest import load_manifest, sha256_file
from scehr.schemas.model_index import ModelIndexError
from scehr.service.settings import Settings
from scehr.training.config import TrainConfig
from scehr.training.data.synthetic import write_synthetic
from scehr.training.export import export_run
from scehr.training.external import ExportedModel, recalibrate
from scehr.training.run import train_run
from tests.service.conftest import serve

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("external")
    home = write_synthetic(root / "home", "mortality", n_train=300, n_test=100, prevalence=0.3,
                           seed=1)
    site = write_synthetic(root / "site", "mortality", n_train=300, n_test=120, prevalence=0.15,
                           seed=7)
    cfg = TrainConfig(task="mortality", data=str(home), out=str(root / "run"), encoder="lstm",
                      encoder_hparams={"units": 4, "depth": 1, "bidirectional": False,
                                       "dropout": 0.0, "static": True},
                      loss="cbce", lam=0.01, batch_size=32, epochs=2, seed=0, threads=1,
                      n_boot=20, tsne=False, progress=False)
    train_run(cfg)
    export_run(root / "run", root / "models" / "mortality" / "0.1.0")
    return root, home, site


def test_onnx_scoring_reproduces_the_runs_own_test_predictions(setup: tuple) -> None:
    root, home, _ = setup
    model = ExportedModel(root / "models" / "mortality" / "0.1.0")
    scored = model.score(model.load(home, "test"))
    with np.load(root / "run" / "predictions.npz") as saved:
        np.testing.assert_allclose(scored.probability, saved["test_probability"][:, 0],
                                   atol=1e-5)
        np.testing.assert_array_equal(scored.y, saved["test_y"][:, 0])


@pytest.mark.anyio
async def test_recalibrate_writes_a_new_version_the_service_serves(setup: tuple) -> None:
    root, _, site = setup
    shipped = root / "models" / "mortality" / "0.1.0"
    before = (shipped / "manifest.json").read_text()
    site_models = root / "site-models"
    out, changes = recalibrate(shipped, site, site_models / "mortality" / "0.1.0-site")
    assert changes
    assert (shipped / "manifest.json").read_text() == before  # the shipped folder is untouched
    m = load_manifest(out / "manifest.json")
    assert m.version == "0.1.0-site" and m.onnx.sha256 == sha256_file(out / "model.onnx")
    assert "site" in m.classes[0].calibration.fitted_on and "recalibrated" in m.notes[-1]
    assert m.metrics["site_recalibration"]["site_test"]["n"] == 120
    report = json.loads((out / "report" / "report.json").read_text())  # against its parent
    assert report["models"]["compare"]["model"]["version"] == "0.1.0-site"
    assert (out / "report" / "report.html").is_file()
    assert json.loads((site_models / "index.json").read_text())["defaults"]["mortality"] == (
        "0.1.0-site")  # the only model of that folder
    with pytest.raises(ModelIndexError, match="already"):
        recalibrate(shipped, site, site_models / "mortality" / "0.1.0-site")
    payload = json.loads((REPO / "examples" / "mortality_stay_benchmark17.json").read_text())
    async with serve(Settings(model_dir=site_models, device="cpu")) as client:
        r = await client.post("/predict/mortality", json=payload)
    assert r.status_code == 200, r.text
    result = r.json()["results"][0]
    cal = m.classes[0].calibration
    if cal.method == "none" or cal.input == "probability":  # the risk follows from the score
        expected = cal.apply(np.array([result["score"]]), np.array([np.nan]))
        assert result["risk"] == pytest.approx(float(expected[0]), abs=1e-6)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
