"""`scehr study`: cells trained once, grid chosen on validation, resumable, summary vs BCE."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scehr import cli as scehr_cli
from scehr.training.data.synthetic import write_synthetic
from scehr.training.studies.study import Progress, load_study, point_name, run_study

STUDY = """title = "tiny"
seeds = [0, 1]
reference = "bce"
n_boot = 20
[overrides]
task = "mortality"
epochs = 1
batch_size = 16
threads = 1
n_boot = 5
tsne = false
encoder_hparams = {units = 4, depth = 1, bidirectional = false, dropout = 0.0}
[methods.bce]
loss = "bce"
[methods.cbce_scr]
loss = "cbce"
[methods.cbce_scr.grid]
lam = [0.0, 0.01]
[methods.ssl]
loss = "cbce"
reference = "cbce_scr"
regime = "ssl"
pretrain = {objective = "ntxent_segments", epochs = 1}
"""


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("synth"), "mortality", n_train=60,
                           n_test=30, prevalence=0.3, seed=0)


@pytest.mark.slow
def test_study_trains_each_cell_once_and_summarizes_against_the_reference(
        data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    study = tmp_path / "study.toml"
    study.write_text(STUDY)
    out = tmp_path / "out"
    args = ["study", str(study), "--data", str(data_dir), "--out", str(out)]
    assert scehr_cli.main(args) == 0
    printed = capsys.readouterr().out
    # 4 grid cells on seed 0 (bce, cbce_scr x 2, ssl), then 3 chosen cells on seed 1
    assert "[7/7]" in printed and "ETA" in printed
    summary = json.loads((out / "summary.json").read_text())
    rows = summary["methods"]
    assert set(rows) == {"bce", "cbce_scr", "ssl"} and "vs_reference" not in rows["bce"]
    grid = {}
    for lam in (0.0, 0.01):
        m = json.loads((out / "cbce_scr" / f"lam{lam:g}-s0" / "metrics.json").read_text())
        grid[lam] = m["val"]["auroc"]
    assert rows["cbce_scr"]["chosen"] == {"lam": max(grid, key=lambda k: grid[k])}
    chosen = point_name(rows["cbce_scr"]["chosen"])
    assert (out / "cbce_scr" / f"{chosen}-s1" / "metrics.json").is_file()
    assert rows["cbce_scr"]["reference"] == "bce" and rows["ssl"]["reference"] == "cbce_scr"
    for name in ("cbce_scr", "ssl"):
        d = rows[name]["vs_reference"]["auroc"]
        assert d["low"] <= d["diff"] <= d["high"]
        assert set(rows[name]["test"]) == {"auroc", "auprc", "min_se_ppv", "balanced_accuracy"}
    assert "| bce |" in (out / "summary.md").read_text()

    assert scehr_cli.main(args) == 0  # rerun: every cell is read back, none retrained
    again = capsys.readouterr().out
    assert again.count("done before") == 7
    assert json.loads((out / "summary.json").read_text())["methods"]["ssl"]["test"] == \
        rows["ssl"]["test"]


def test_progress_eta_counts_only_trained_cells() -> None:
    p = Progress(total=4)
    assert p.step("a", 0.0, trained=False).endswith("ETA n/a")
    assert p.step("b", 60.0, trained=True).endswith("ETA 2.0 min")


def test_study_file_errors_name_the_key(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('reference = "bce"\n[methods.cbce]\nloss = "cbce"\n')
    with pytest.raises(ValueError, match="reference 'bce' is not one of the methods"):
        load_study(path)
    path.write_text('[methods.bce]\nloss = "bce"\n[methods.bce.grid]\nlam = 0.1\n')
    with pytest.raises(ValueError, match=r"methods\.bce\.grid\.lam must be a non-empty list"):
        load_study(path)


SPLIT = """seeds = [0]
reference = "bce"
n_boot = 20
[overrides]
epochs = 1
batch_size = 16
threads = 1
n_boot = 5
tsne = false
plots = false
encoder_hparams = {units = 4, depth = 1, bidirectional = false, dropout = 0.0}
[methods.bce]
loss = "bce"
lam = 0.0
[methods.cbce_scr]
loss = "cbce"
lam = 0.01
"""


@pytest.mark.slow
def test_methods_option_trains_only_those_then_a_full_run_reads_them_back(
        data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    study = tmp_path / "split.toml"
    study.write_text(SPLIT)  # task: the config default, mortality
    out = tmp_path / "out"
    args = ["study", str(study), "--data", str(data_dir), "--out", str(out)]
    assert scehr_cli.main([*args, "--methods", "cbce_scr"]) == 0
    assert (out / "cbce_scr" / "default-s0" / "metrics.json").is_file()
    assert not (out / "bce").exists() and not (out / "summary.json").exists()
    capsys.readouterr()
    assert scehr_cli.main(args) == 0  # the whole study: bce trains, cbce_scr is read back
    printed = capsys.readouterr().out
    assert printed.count("done before") == 1
    rows = json.loads((out / "summary.json").read_text())["methods"]
    assert rows["cbce_scr"]["spec"] == {"loss": "cbce", "lam": 0.01}
    assert rows["cbce_scr"]["series"] == "cbce_scr"
    with pytest.raises(ValueError, match=r"--methods \['focal'\] are not methods"):
        run_study(study, out=out, data=str(data_dir), methods=["focal"])


@pytest.mark.slow
def test_multilabel_study_reports_micro_and_macro_auroc_against_the_reference(
        tmp_path: Path) -> None:
    data = write_synthetic(tmp_path / "pheno", "phenotypes", n_train=80, n_test=40,
                           prevalence=0.3, seed=0)
    study = tmp_path / "pheno.toml"
    study.write_text(SPLIT.replace("[overrides]\n", '[overrides]\ntask = "phenotypes"\n'))
    summary = run_study(study, out=tmp_path / "out", data=str(data), echo=lambda _: None)
    assert summary is not None
    rows = summary["methods"]
    assert set(rows["bce"]["test"]) == {"micro_auroc", "macro_auroc"}
    d = rows["cbce_scr"]["vs_reference"]
    assert set(d) == {"micro_auroc", "macro_auroc"}
    assert d["micro_auroc"]["low"] <= d["micro_auroc"]["diff"] <= d["micro_auroc"]["high"]
    # the point estimate is the seed average of the runs' own test micro-AUROC
    per_run = json.loads((tmp_path / "out" / "bce" / "default-s0" / "metrics.json").read_text())
    assert rows["bce"]["test"]["micro_auroc"]["value"] == pytest.approx(
        per_run["test"]["micro_auroc"], abs=1e-9)
    assert "test micro-AUROC" in (tmp_path / "out" / "summary.md").read_text()
