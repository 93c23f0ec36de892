"""Training a user can watch, stop and resume: a run stopped by SIGINT mid-epoch and resumed
with `scehr train --resume RUN` ends bit-for-bit where an uninterrupted run ends."""

from __future__ import annotations

import csv
import functools
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from scehr import cli as scehr_cli
from scehr.training import run as training_run
from scehr.training.data.synthetic import write_synthetic
from scehr.training.fit import RESUME_FILE, LoopState

CONFIG = """task = "mortality"
encoder = "lstm"
loss = "cbce"
lam = 0.01
epochs = 3
patience = 5
batch_size = 16
threads = 1
n_boot = 5
tsne = false
progress = false
{extra}
[encoder_hparams]
units = 4
depth = 2
bidirectional = true
dropout = 0.3
"""

#: Joint training with a stateful term (the debiased loss's memory queue), and the SSL regime
#: stopped while pre-training (the segment cuts draw from the global RNG).
CASES = {
    "joint-debiased": ("[regularizers.debiased_supcon]\nweight = 0.1\nqueue_size = 32", 7),
    "ssl-pretrain": ('regime = "ssl"\n[pretrain]\nobjective = "ntxent_segments"\nepochs = 2',
                     3),
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("synth"), "mortality", n_train=80,
                           n_test=24, prevalence=0.3, seed=0)


def _train(config: Path, data: Path, out: Path) -> int:
    return scehr_cli.main(["train", "--config", str(config), "--data", str(data),
                           "--out", str(out)])


def _interrupt_at(step: int) -> Callable[[LoopState], None]:
    """An on_step hook that sends this process SIGINT after the `step`-th step overall."""
    calls = [0]

    def hook(state: LoopState) -> None:
        calls[0] += 1
        if calls[0] == step:
            os.kill(os.getpid(), signal.SIGINT)
    return hook


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_stopped_and_resumed_run_equals_an_uninterrupted_one(
        case: str, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    extra, stop_step = CASES[case]
    handler = signal.getsignal(signal.SIGINT)  # whatever the suite started with (nohup: ignored)
    config = tmp_path / "run.toml"
    config.write_text(CONFIG.format(extra=extra))
    assert _train(config, data_dir, tmp_path / "whole") == 0

    fit = training_run.fit
    monkeypatch.setattr(training_run, "fit",
                        functools.partial(fit, on_step=_interrupt_at(stop_step)))
    capsys.readouterr()
    assert _train(config, data_dir, tmp_path / "split") == 128 + signal.SIGINT
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "stopped by SIGINT" in err and "--resume" in err
    assert (tmp_path / "split" / RESUME_FILE).is_file()
    assert not (tmp_path / "split" / "metrics.json").exists()
    assert signal.getsignal(signal.SIGINT) == handler  # the handler it found, restored

    monkeypatch.setattr(training_run, "fit", fit)
    assert scehr_cli.main(["train", "--resume", str(tmp_path / "split")]) == 0
    assert not (tmp_path / "split" / RESUME_FILE).exists()

    whole = torch.load(tmp_path / "whole" / "model.pt", weights_only=False)["state_dict"]
    split = torch.load(tmp_path / "split" / "model.pt", weights_only=False)["state_dict"]
    assert whole.keys() == split.keys()
    for k in whole:
        assert torch.equal(whole[k], split[k]), k
    m_whole = json.loads((tmp_path / "whole" / "metrics.json").read_text())
    m_split = json.loads((tmp_path / "split" / "metrics.json").read_text())
    assert m_whole["test"] == m_split["test"] and m_whole["best_epoch"] == m_split["best_epoch"]
    with open(tmp_path / "whole" / "epochs.csv") as f1, open(tmp_path / "split" /
                                                              "epochs.csv") as f2:
        rows1, rows2 = list(csv.DictReader(f1)), list(csv.DictReader(f2))
    assert [r["val_auroc"] for r in rows1] == [r["val_auroc"] for r in rows2]
    assert [r["train_loss"] for r in rows1] == [r["train_loss"] for r in rows2]


@pytest.mark.slow
def test_train_writes_one_line_per_epoch_to_its_log_and_stdout(
        data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "run.toml"
    config.write_text(CONFIG.format(extra=""))
    code = scehr_cli.main(["train", "--config", str(config), "--data", str(data_dir),
                           "--out", str(tmp_path / "run"), "--epochs", "2", "--batch-size", "32"])
    assert code == 0
    out = capsys.readouterr().out
    assert "overrides: batch_size=32 (config: 16), epochs=2 (config: 3)" in out
    assert "torch threads: 1" in out
    log = (tmp_path / "run" / "train.log").read_text().splitlines()
    epochs = [line for line in log if " train epoch " in line]
    assert len(epochs) == 2
    assert all(k in epochs[1] for k in ("loss ", "cce ", "scr ", "val auroc ", "best ", " s"))
    assert "train epoch 2/2" in out  # stdout is not a terminal under pytest: lines, no bar
    assert any("test bootstrap: 5 resamples" in line for line in log)


def test_resume_without_a_checkpoint_says_why(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"task": "mortality", "data": "x"}))
    assert scehr_cli.main(["train", "--resume", str(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert "resume.pt does not exist" in err


@pytest.mark.slow
def test_a_signal_during_evaluation_finishes_the_run_then_stops(
        data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "run.toml"
    config.write_text(CONFIG.format(extra="plots = true"))
    real = training_run.make_plots

    def plots_then_signal(*args: object, **kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(training_run, "make_plots", plots_then_signal)
    assert _train(config, data_dir, tmp_path / "run") == 128 + signal.SIGTERM
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "nothing to resume" in err
    assert (tmp_path / "run" / "metrics.json").is_file()
    assert (tmp_path / "run" / "roc.png").is_file()  # the step in progress was finished
