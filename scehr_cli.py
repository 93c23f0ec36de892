"""The `scehr` command: one entry point, subcommands registered by each package.

Each module in `COMMAND_MODULES` exposes `register(subparsers)`, adding its subcommands with
`set_defaults(func=...)`. A module whose dependencies are not installed (e.g. torch for the
training commands in a serve-only install) is skipped with a clear message when called.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES: dict[str, tuple[str, str]] = {
    # module: (extra that provides it, one-line help for the missing case)
    "training.data.cli": ("train", "data conversion and inspection"),
    "training.cli": ("train", "train, evaluate, grid, imbalance, export"),
    "service.cli": ("serve", "serve and list models"),
}


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, str]]:
    parser = argparse.ArgumentParser(prog="scehr", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    missing: dict[str, str] = {}
    for name, (extra, what) in COMMAND_MODULES.items():
        try:
            module = importlib.import_module(name)
        except ImportError as e:  # an optional extra is not installed
            missing[name] = f"{what} needs `pip install 'scehr[{extra}]'` ({e.name} missing)"
            continue
        module.register(sub)
    return parser, missing


def main(argv: list[str] | None = None) -> int:
    parser, missing = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        for msg in missing.values():
            print(f"note: {msg}", file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except (FileNotFoundError, NotADirectoryError, ValueError) as e:
        print(f"scehr: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
