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

#: module -> (extra that provides its dependencies, the top-level commands it registers)
COMMAND_MODULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "training.data.cli": ("train", ("data",)),
    "training.cli": ("train", ("train", "evaluate", "grid", "imbalance", "compare", "embedding",
                               "export")),
    "service.cli": ("serve", ("serve", "score", "models")),
}


def build_parser(command: str | None = None) -> tuple[argparse.ArgumentParser, list[str]]:
    """The parser with the modules owning `command` (all of them when None)."""
    parser = argparse.ArgumentParser(prog="scehr", description=__doc__.splitlines()[0])
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
            missing.append(f"`scehr {'|'.join(commands)}` needs `pip install 'scehr[{extra}]'` "
                           f"({e.name} is not installed)")
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


if __name__ == "__main__":
    raise SystemExit(main())
