"""The missing-channel report: an exported model scored with channel groups removed, through
ONNX Runtime, each group encoded as never recorded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scehr.cli import main
from scehr.schemas.tensorize import Observations, discretize
from scehr.training.config import TrainConfig
from scehr.training.data.synthetic import write_synthetic
from scehr.training.export import export_run
from scehr.training.external import ExportedModel
from scehr.training.robustness import ALL, evaluate_missing, markdown_table
from scehr.training.run import train_run


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("robust")
    data = write_synthetic(root / "d", "mortality", n_train=200, n_test=80, prevalence=0.3,
                           seed=2)
    train_run(TrainConfig(task="mortality", data=str(data), out=str(root / "run"),
                          encoder="lstm", encoder_hparams={"units": 4, "depth": 1,
                                                           "bidirectional": False,
                                                           "dropout": 0.0},
                          loss="bce", batch_size=32, epochs=2, seed=0, threads=1, n_boot=5,
                          plots=False, tsne=False, progress=False))
    export_run(root / "run", root / "models" / "mortality" / "0.1.0")
    return root / "models" / "mortality" / "0.1.0", data


def test_each_group_is_scored_as_if_never_recorded(model: tuple[Path, Path]) -> None:
    folder, data = model
    report = evaluate_missing(folder, data, split="test", n_boot=5)
    rows = report["rows"]
    assert next(iter(rows)) == ALL and rows[ALL]["mean_abs_risk_change"] == 0.0
    assert sorted(rows["GCS"]["channels"]) == ["gcs_eye", "gcs_motor", "gcs_total", "gcs_verbal"]
    assert "invasive pressures" not in rows  # benchmark-17 has none: empty groups left out
    # The GCS row equals scoring stays whose GCS columns hold what discretize writes for a
    # stay with no observation at all (every synthetic mortality stay fills its 48 hours).
    m = ExportedModel(folder)
    a = m.load(data, "test")
    gcs = [m.fs.variable_ids.index(v) for v in rows["GCS"]["channels"]]
    empty, _ = discretize(Observations([], [], [], [], 1), m.fs, float(m.fs.window_hours))
    x = a.x.copy()
    for c in gcs:
        cols = [*range(int(m.fs.begins[c]), int(m.fs.begins[c] + m.fs.widths[c])),
                m.fs.n_value_columns + c]
        x[:, :, cols] = empty[0, 0, cols]
    oracle = m.score(a.__class__(**{**a.__dict__, "x": x}))
    assert report["rows"]["GCS"]["mean_risk"] == pytest.approx(float(oracle.risk.mean()))
    assert rows["GCS"]["mean_abs_risk_change"] > 0
    assert report["mean_auroc"] == pytest.approx(
        np.mean([r["auroc"]["value"] for r in rows.values()]))
    table = markdown_table(report)
    assert all(f"| {name} |" in table for name in rows)


def test_the_command_prints_the_table_and_writes_json(model: tuple[Path, Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    folder, data = model
    assert main(["robustness", str(folder), "--data", str(data), "--split", "val",
                 "--n-boot", "5", "--out", str(tmp_path / "r.json")]) == 0
    assert "| GCS |" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["split"] == "val"
