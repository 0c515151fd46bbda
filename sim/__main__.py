"""`python -m sim COMMAND`: one parser, each subcommand's module from sim/cli/ registered on it.

The hall of the command-line wing: it knows which subcommands there are (`SUBCOMMANDS`),
builds the parser and dispatches; each subcommand module does the rest.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from .cli import calibrate, compare, figures, plan, plot, sweep

SUBCOMMANDS = (compare, sweep, plan, plot, figures, calibrate)  # in the order `--help` lists them


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit code 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The `sim` parser with every subcommand registered (each sets `handle` as its default)."""
    parser = Parser(
        prog="sim",
        description="Simulate pipeline-parallel schedules: compare them, sweep sizes, plot timelines.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default sys.argv[1:]), run the subcommand and return its exit code."""
    args = build_parser().parse_args(argv)
    try:
        return args.handle(args)
    except BrokenPipeError:
        # The reader went away (`python -m sim sweep | head`): stop quietly, as the Python
        # docs advise, by pointing stdout at devnull so the exit flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
