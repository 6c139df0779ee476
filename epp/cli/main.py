"""The ``epp`` command line: ``serve``, ``check-config``, ``envoy-config`` and ``demo``.

Each sub-command lives in its own module and registers an argparse sub-parser through ``add_parser(sub)``;
this module only assembles them (explicit composition, no import-time side effects).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Callable, Sequence

__all__ = ["main", "build_parser"]

# Modules providing ``add_parser(subparsers) -> None``; each sets ``func`` on its sub-parser.
COMMAND_MODULES = ("epp.cli.check", "epp.cli.serve", "epp.cli.envoy", "epp.cli.demo")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every available sub-command."""
    from epp import __version__

    parser = argparse.ArgumentParser(prog="epp", description="Endpoint picker for LLM inference")
    parser.add_argument("--version", action="version", version=f"epp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue  # that command is not part of this build
            raise
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``epp`` console script; returns the process exit code."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
