"""The command-line wing of sim/: `python -m sim COMMAND`, one module per subcommand.

Each subcommand module registers its parser (`add_parser`), reads the parsed arguments
into a frozen dataclass of typed options at the edge, and calls library functions of
the model (sim/*.py) and plot (sim/plot/) wings; the argparse Namespace goes no further.
The modules share only `args` (argument types, the cost flags, the error line); none
imports another.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from . import calibrate, compare, figures, plot, sweep

SUBCOMMANDS = (compare, sweep, plot, figures, calibrate)  # in the order `--help` lists them


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
