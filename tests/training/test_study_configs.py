"""Every method of every study file in configs/ trains one epoch on synthetic data (the studies'
acceptance: each method trains from a config in CI), with the study's own keys and grid."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from scehr.training.data.synthetic import write_synthetic
from scehr.training.fit import prepare
from scehr.training.run import train_run
from scehr.training.studies.study import cell_config, load_study

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
STUDIES = sorted(CONFIGS.glob("study_*.toml"))
TINY = {"units": 4, "depth": 1, "bidirectional": False, "dropout": 0.0}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("synth"), "both", n_train=120, n_test=30,
                           prevalence=0.3, seed=0)


def test_the_study_files_are_found() -> None:
    names = {p.stem for p in STUDIES}
    assert {"study_mortality_p12_uncapped", "study_phenotypes_eicu",
            "study_imbalance_p12"} <= names


@pytest.mark.slow
@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_every_method_trains_one_epoch(path: Path, data_dir: Path, tmp_path: Path) -> None:
    study = load_study(path)
    for method in study.methods:
        for point in study.grid(method):  # every grid value must make a valid config
            cfg = cell_config(study, method, point, 0, tmp_path, str(data_dir))
        cfg = dataclasses.replace(
            cfg, epochs=1, batch_size=16, encoder_hparams=TINY, n_boot=5, plots=False,
            feature_set="",  # the synthetic data has the benchmark-17 layout
            tsne=False, pretrain={**cfg.pretrain, "epochs": 1} if cfg.pretrain else {})
        metrics = train_run(cfg, prepare(cfg), echo=False)
        assert metrics["epochs_run"] == 1, method
        assert metrics["test"][metrics["test"]["headline"]] is not None, method
