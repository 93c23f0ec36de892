"""Training on two processes (gloo, CPU) is training on one: the same losses and gradients at
every step for every objective of the registries; a run launched with `scehr train --nproc 2`
exports a model the service scores; a run stopped on one process resumes on two."""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from scehr import cli as scehr_cli
from scehr.schemas.manifest import load_manifest
from scehr.training import run as training_run
from scehr.training.cli import torchrun_command
from scehr.training.data.synthetic import write_synthetic
from scehr.training.distributed import World, share_sizes
from scehr.training.export import export_run
from scehr.training.fit import RESUME_FILE
from tests.training.distributed_steps import BATCH_SIZES, cases, steps
from tests.training.test_resume import _interrupt_at

REPO = Path(__file__).resolve().parents[2]
STEPS_SCRIPT = Path(__file__).with_name("distributed_steps.py")
#: The brief's bound: losses and gradients of two processes within 1e-6 of one process's.
TOLERANCE = 1e-6


def torchrun(nproc: int, *args: str) -> list[str]:
    return ["nice", "-n", "10", sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", *args]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("synth"), "mortality", n_train=60,
                           n_test=20, prevalence=0.3, seed=0)


@pytest.fixture(scope="module")
def two_processes(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every case's steps computed by two gloo processes under torchrun (rank 0's record)."""
    out = tmp_path_factory.mktemp("two-processes")
    r = subprocess.run(torchrun(2, str(STEPS_SCRIPT), str(data_dir), str(out)),
                       capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    saved = torch.load(out / "steps.pt", weights_only=False)
    assert saved["world_size"] == 2
    return saved["results"]


def test_shares_of_a_global_batch_are_contiguous_and_cover_it() -> None:
    assert share_sizes(13, 2) == [7, 6] and share_sizes(1, 2) == [1, 0]
    assert share_sizes(256, 4) == [64] * 4
    rows = [World(r, 3).rows(8) for r in range(3)]
    assert [(s.start, s.stop) for s in rows] == [(0, 3), (3, 6), (6, 8)]


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(cases()))
def test_two_processes_compute_the_losses_and_gradients_of_one(
        case: str, data_dir: Path, two_processes: dict[str, Any]) -> None:
    """Global batches of 13 (7 + 6 rows), 13 (the debiased queue now holds the first) and 1
    (the second process has no row): each step's loss, each named part of it and every
    parameter's gradient agree with one process's to 1e-6 (float64: the sides differ by the
    order of float sums only)."""
    one, two = steps(data_dir, case), two_processes[case]
    assert len(one["sums"]) == len(two["sums"]) == len(BATCH_SIZES)
    first = one["sums"][0]
    # the check has teeth: every term of the objective is non-zero on the first batch
    assert all(abs(v) > 1e-3 for v in first.values()), first
    for step, (a, b) in enumerate(zip(one["sums"], two["sums"], strict=True)):
        assert a.keys() == b.keys()
        for name in a:
            assert abs(a[name] - b[name]) <= TOLERANCE, (step, name, a[name], b[name])
    for step, (a, b) in enumerate(zip(one["grads"], two["grads"], strict=True)):
        assert a.keys() == b.keys() and a
        for name in a:
            gap = float((a[name] - b[name]).abs().max())
            assert gap <= TOLERANCE, (step, name, gap)


def _cli_train(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nice", "-n", "10", sys.executable, "-m", "scehr.cli", "train",
                           *args], capture_output=True, text=True, cwd=REPO, timeout=600)


TINY = ["--task", "mortality", "--encoder", "lstm", "--loss", "cbce", "--lam", "0.1",
        "--regularizer", "debiased_supcon@0.1", "--batch-size", "16", "--epochs", "2",
        "--threads", "1", "--n-boot", "10", "--no-plots", "--no-progress",
        "--encoder-param", "units=4", "--encoder-param", "depth=1",
        "--encoder-param", "bidirectional=false", "--encoder-param", "dropout=0.0"]


@pytest.mark.slow
def test_nproc_2_trains_and_exports_a_model_that_serves(data_dir: Path, tmp_path: Path) -> None:
    from scehr.service.offline_scoring import score

    run = tmp_path / "run"
    r = _cli_train(*TINY, "--data", str(data_dir), "--out", str(run), "--nproc", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "torch.distributed.run" in r.stdout and "--nproc-per-node=2" in r.stdout
    assert r.stdout.count("test auroc") == 1  # rank 0 alone prints the summary
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["batch_size"] == 16
    assert len(metrics["val"]) and (run / "epochs.csv").read_text().count("\n") == 3

    folder = tmp_path / "models" / "mortality" / "0.1.0"
    export_run(run, folder)
    note = ("training: 2 processes (torch.distributed), global batch 16 stays (8 per "
            "process); every contrastive term over the global batch")
    assert note in load_manifest(folder / "manifest.json").notes
    assert "- T" + note[1:] in (folder / "MODEL_CARD.md").read_text()
    stays = data_dir / "in-hospital-mortality" / "test"
    summary = score(str(folder), stays, tmp_path / "scores.jsonl", model_dir=tmp_path / "models",
                    device="cpu", progress=False)
    assert summary.read == 20 and summary.scored + summary.abstained == 20
    assert summary.scored > 0 and summary.errors == 0
    rows = [json.loads(line) for line in (tmp_path / "scores.jsonl").read_text().splitlines()]
    risks = [c["risk"] for r in rows for c in r["results"].values()]
    assert len(risks) == summary.scored and all(0.0 <= x <= 1.0 for x in risks), rows[0]


@pytest.mark.slow
def test_a_run_stopped_on_one_process_resumes_on_two(
        data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoint holds global batches and shared generators only, so two processes carry
    on where one stopped and end at the weights of an uninterrupted one-process run (within
    float32 rounding of differently ordered sums)."""
    args = [*TINY, "--data", str(data_dir)]
    assert scehr_cli.main(["train", *args, "--out", str(tmp_path / "whole")]) == 0
    fit = training_run.fit
    monkeypatch.setattr(training_run, "fit", functools.partial(fit, on_step=_interrupt_at(4)))
    code = scehr_cli.main(["train", *args, "--out", str(tmp_path / "split")])
    assert code == 128 + signal.SIGINT and (tmp_path / "split" / RESUME_FILE).is_file()

    r = _cli_train("--resume", str(tmp_path / "split"), "--nproc", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((tmp_path / "split" / "metrics.json").read_text())["world_size"] == 2
    whole = torch.load(tmp_path / "whole" / "model.pt", weights_only=False)["state_dict"]
    split = torch.load(tmp_path / "split" / "model.pt", weights_only=False)["state_dict"]
    assert whole.keys() == split.keys()
    for k in whole:
        torch.testing.assert_close(split[k], whole[k], atol=1e-5, rtol=1e-5, msg=k)


def test_nproc_runs_torchrun_without_its_own_option_and_needs_a_run_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """torchrun would read `--nproc` as its `--nproc-per-node`: the wrapper leaves it out."""
    argv = ["train", "--data", "D", "--nproc", "2", "--out", "R", "--nproc=2", "--epochs", "3"]
    command = torchrun_command(2, argv)
    assert command[1:6] == ["-m", "torch.distributed.run", "--standalone",
                            "--nproc-per-node=2", "-m"]
    assert command[6:] == ["scehr.cli", "train", "--data", "D", "--out", "R", "--epochs", "3"]
    assert scehr_cli.main(["train", "--data", str(tmp_path), "--nproc", "2"]) != 0
    assert "--nproc needs --out" in capsys.readouterr().err


def test_a_landmark_task_is_refused_on_several_processes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its objective over (stay, hour) rows has no global-batch form: refused, not trained on
    each process's rows as if it were the 48-hour objective."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert scehr_cli.main(["train", "--task", "mortality-landmark", "--data", str(tmp_path),
                           "--out", str(tmp_path / "run")]) != 0
    assert "train a landmark task on one process" in capsys.readouterr().err
