"""The ``accel`` command line.

Each subcommand lives in its subpackage's ``cli`` module, which exposes ``register(subparsers)``; it adds its parser
and sets ``func`` (a callable taking the parsed ``argparse.Namespace`` and returning an exit code). Modules are imported
only to build the parser, and a subpackage whose optional dependencies are missing simply has no subcommand.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from accel.errors import AccelError

# subpackage cli modules, in the order their commands appear in --help
_COMMAND_MODULES = (
    "accel.formats.cli",  # compress
    "accel.backends.cli",  # export
    "accel.spd.cli",  # generate
    "accel.sim.cli",  # predict
    "accel.drafts.cli",  # distill, eval-draft
    "accel.superposed.cli",  # ngrams, complete
    "accel.demo",  # demo
)


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every available subcommand."""
    parser = argparse.ArgumentParser(prog="accel", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a subpackage not yet present, or an optional dependency missing
            if exc.name and (exc.name == name or name.startswith(exc.name + ".") or not exc.name.startswith("accel")):
                continue
            raise
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``accel`` console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except AccelError as exc:
        print(f"accel {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
