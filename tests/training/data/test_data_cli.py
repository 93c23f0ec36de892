"""`scehr data ...`: exit codes and messages, synth + inspect end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from scehr.cli import main


@pytest.fixture(autouse=True)
def _no_cache_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCEHR_CACHE_DIR", raising=False)


@pytest.mark.parametrize("argv", [
    ["data", "inspect", "{p}"],
    ["data", "convert-physionet2012", "{p}", "{out}"],
    ["data", "convert-eicu-demo", "{p}", "{out}"],
])
def test_wrong_path_is_a_clean_error(argv: list[str], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-folder"
    args = [a.format(p=missing, out=tmp_path / "out") for a in argv]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("scehr: error:") and str(missing) in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_inspect_names_the_expected_layout(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "inspect", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "in-hospital-mortality/{train,test}/listfile.csv" in err


def test_synth_then_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "synth"
    assert main(["data", "synth", str(out), "--task", "mortality", "--n-train", "40",
                 "--n-test", "10", "--prevalence", "0.3", "--seed", "2"]) == 0
    assert main(["data", "inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "== mortality" in text and "heart_rate" in text and "30.0%" in text
    assert "phenotypes" not in text


def test_data_without_subcommand_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data"]) == 2
    assert "convert-physionet2012" in capsys.readouterr().out
