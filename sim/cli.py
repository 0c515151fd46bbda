"""`python -m sim`: one parser; each subcommand module registers itself with add_parser."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Sequence

# Subcommand modules (each has add_parser(subparsers) setting func=handler, handler(args) -> int).
# Optional ones are skipped while their module does not exist yet.
REQUIRED = ("sim.compare_cli", "sim.sweep_cli", "sim.plot_cli", "sim.calibrate_cli", "sim.plan_cli")
OPTIONAL: tuple[str, ...] = ()


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit code 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="sim",
        description="Simulate pipeline-parallel schedules: compare them, sweep sizes, plot timelines.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in REQUIRED + OPTIONAL:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if name in OPTIONAL and exc.name == name:
                continue
            raise
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default sys.argv[1:]), run the subcommand and return its exit code."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        # The reader went away (`python -m sim sweep | head`): stop quietly, as the Python
        # docs advise, by pointing stdout at devnull so the exit flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
