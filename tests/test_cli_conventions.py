"""`scehr` conventions: --version, defaults in every --help, one-line errors, missing extras."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from scehr import cli as scehr_cli


def all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                out += all_parsers(sub)
    return out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        scehr_cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("scehr 0.")


def test_every_option_with_a_default_shows_it_in_help() -> None:
    parser, missing = scehr_cli.build_parser()
    assert not missing
    parsers = all_parsers(parser)
    assert len(parsers) > 10
    for p in parsers:
        text = p.format_help()
        for a in p._actions:
            if not a.option_strings or a.default == argparse.SUPPRESS:
                continue  # positionals, --help, --version
            assert a.help, f"{p.prog} {a.option_strings[0]} has no help"
            shown = p._get_formatter()._get_help_string(a) or ""
            if a.default is not None:  # None: unset, the help says what applies instead
                assert "default" in shown, f"{p.prog} {a.option_strings[0]}: default not shown"
        assert "%(" not in text


@pytest.mark.parametrize("argv, message", [
    (["train", "--lam", "-0.1"], "must be a finite number >= 0"),
    (["train", "--lam", "5"], "λ must be in [0, 1]"),
    (["train", "--batch-size", "0"], "must be >= 1"),
    (["train", "--loss", "hinge"], "invalid choice: 'hinge'"),
])
def test_bad_options_fail_in_one_line(argv: list[str], message: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        scehr_cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and "Traceback" not in "\n".join(err)


def test_train_commands_say_they_need_the_train_extra_without_torch(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A serve-only install: torch cannot be imported, so `scehr train` explains in one line."""
    for name in list(sys.modules):
        if name.split(".")[0] == "torch" or name.startswith("scehr.training"):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` -> ModuleNotFoundError
    assert scehr_cli.main(["train", "--help"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["scehr: error: `scehr train|evaluate|recalibrate|grid|imbalance|compare|"
                   "study|embedding|ensemble|export` needs `pip install 'scehr[train]'` (torch is "
                   "not installed)"]
    parser, missing = scehr_cli.build_parser()
    assert any("scehr[train]" in m for m in missing)
    assert "serve" in parser.format_help()


def test_service_commands_without_a_runtime_name_the_runtime_extras(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    """`serve` installs no ONNX Runtime (the `cpu` and `gpu` extras do): the one-line error
    names the extra to add, not `serve` again."""
    for name in list(sys.modules):
        if name.split(".")[0] == "onnxruntime" or name.startswith("scehr.service"):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` fails
    stays = tmp_path / "stays.jsonl"
    stays.write_text("{}\n")
    assert scehr_cli.main(["score", "mortality", str(stays), "--out",
                           str(tmp_path / "out.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["scehr: error: `scehr serve|score|models` needs ONNX Runtime: `pip install "
                   "'scehr[serve,cpu]'`, or 'scehr[serve,gpu]' on a machine with an NVIDIA GPU "
                   "(onnxruntime is not installed)"]
