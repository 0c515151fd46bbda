"""`python -m sim figures`: regenerate the figures README shows (sim.plot.readme)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from schedules import ScheduleError

from .args import fail, one_line


@dataclass(frozen=True)
class FiguresOptions:
    """`sim figures` as typed values."""

    out: str

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "FiguresOptions":
        return cls(out=args.out)


def add_parser(subparsers) -> None:
    """Register `figures` on an argparse subparsers object."""
    figures = subparsers.add_parser(
        "figures", help="regenerate the figures README shows",
        description="Regenerate every figure in figures/ that README shows.",
    )
    figures.add_argument("--out", default="figures", metavar="DIR", help="directory to write (default figures)")
    figures.set_defaults(handle=handle)


def handle(args: argparse.Namespace) -> int:
    """Handle `sim figures`; returns the exit code."""
    from ..plot.readme import regenerate  # matplotlib loads only for the commands that draw

    options = FiguresOptions.from_args(args)
    try:
        for path in regenerate(options.out):
            print(path)
    except (ScheduleError, ValueError, OSError) as exc:
        return fail("figures", one_line(exc))
    return 0
