"""The `scehr` command: one entry point, subcommands registered by each package.

Each module in `COMMAND_MODULES` exposes `register(subparsers)`, adding its subcommands with
`set_defaults(func=...)`. Only the module that owns the command being run is imported, so
`scehr serve` loads neither training code nor its dependencies; a module whose optional extra
is not installed (torch for training in a serve-only install) is reported clearly.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from importlib import metadata
from typing import Any

#: module -> (extra that provides its dependencies, the top-level commands it registers)
COMMAND_MODULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "scehr.training.data.cli": ("train", ("data",)),
    "scehr.training.cli": ("train", ("train", "evaluate", "recalibrate", "grid", "imbalance",
                                     "compare", "study", "embedding", "ensemble", "export")),
    "scehr.service.cli": ("serve", ("serve", "score", "models")),
}


#: What `scehr --help` says the product is, before the list of commands.
DESCRIPTION = (
    "scehr: risk scores for intensive care stays from their time series (in-hospital "
    "mortality from the first 48 hours, 25 phenotypes from the stay). Serve the shipped "
    "models over HTTP (JSON, FHIR R4, CDS Hooks), score files in batch, check and recalibrate "
    "a model on your own data, or train your own with supervised contrastive losses.")
EPILOG = """common commands:
  scehr serve                          start the API on :8000 with the models in models/
  scehr score mortality STAYS --out F  score a file or folder of stays, one row per stay
  scehr evaluate MODEL_DIR --data DIR  how a model does on your converted data
  scehr recalibrate MODEL_DIR --data DIR --out SITE_DIR   a site's own calibration
  scehr train --config configs/default_mortality_full.toml --data DIR
  scehr COMMAND --help                 the options of one command
the integration guide: docs/hospital.md"""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in --help; options whose default is "unset" (None) say so in
    their own help text (e.g. "default: from --config")."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """The `scehr` parser class, for every subcommand too (argparse reuses it for subparsers)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def version() -> str:
    try:
        return metadata.version("scehr")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


#: The module of the ONNX Runtime extras `cpu` and `gpu` (pyproject.toml): no other extra
#: installs it, so a command that needs it names its own extra plus one of these.
RUNTIME_MODULE = "onnxruntime"


def missing_extra(e: ModuleNotFoundError, commands: tuple[str, ...], extra: str) -> str:
    if (e.name or "").split(".")[0] == RUNTIME_MODULE:
        return (f"`scehr {'|'.join(commands)}` needs ONNX Runtime: `pip install "
                f"'scehr[{extra},cpu]'`, or 'scehr[{extra},gpu]' on a machine with an NVIDIA "
                f"GPU ({e.name} is not installed)")
    return (f"`scehr {'|'.join(commands)}` needs `pip install 'scehr[{extra}]'` "
            f"({e.name} is not installed)")


def build_parser(command: str | None = None) -> tuple[argparse.ArgumentParser, list[str]]:
    """The parser with the modules owning `command` (all of them when None)."""
    parser = Parser(prog="scehr", description=textwrap.fill(DESCRIPTION, 79), epilog=EPILOG,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"scehr {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    missing: list[str] = []
    for name, (extra, commands) in COMMAND_MODULES.items():
        if command is not None and command not in commands:
            continue
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and name.startswith(e.name):
                raise
            missing.append(missing_extra(e, commands, extra))
            continue
        module.register(sub)
    return parser, missing


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    known = {c for _, cmds in COMMAND_MODULES.values() for c in cmds}
    command = argv[0] if argv and argv[0] in known else None
    parser, missing = build_parser(command)
    if command is not None and missing:
        print(f"scehr: error: {missing[0]}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    args.argv = argv  # the command line, for hints such as `scehr score`'s resume command
    if getattr(args, "func", None) is None:
        parser.print_help()
        for msg in missing:
            print(f"note: {msg}", file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except (FileNotFoundError, NotADirectoryError, ValueError) as e:
        print(f"scehr: error: {e}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as e:  # an optional dependency imported late by a command
        extra, commands = next(((x, c) for x, c in COMMAND_MODULES.values()
                                if args.command in c), ("train", (str(args.command),)))
        print(f"scehr: error: {missing_extra(e, commands, extra)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
