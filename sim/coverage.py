"""What a program asks of a calibration beyond what the calibration's runs showed.

A calibration fits each term from what its runs hold; a program that holds more relies on a
term the runs could not tell or on a law carried past them, and its prediction is to be
trusted less. Four things are checked, each from the streams alone (no simulation):

- **Runs of repeats** (schedules.analysis.longest_repeats). What the k-th action of a run of its
  stage and kind saves (sim.costs.repeat_factor) is told only by runs of three or more; at
  p=2 a 1F1B, ZB-H1 or interleaved run at m=2p holds runs of two at most, and GPipe's phases
  then cost their stage cost throughout: on the CPU executor at 2 rows per microbatch GPipe m=8's forwards
  ran 0.54x that and the three-run calibration predicted its step 12-15% long (sweep 23,
  bench/fidelity_sweeps.md). Runs longer than the calibration's are carried by the law, which
  from runs of 4 to runs of 8 saved more than the runs did (sweep 17).
- **Stage switches.** A rank that runs several stages switches between them (interleaved,
  V-shapes); a calibration from runs with one stage per rank has priced no such switch.
- **Ranks.** The calibration's transfer law, sharing of cores and growth into the step were
  fitted at its runs' rank counts.
- **Stage sizes.** A stage of a layer count that no run held is priced by the per-layer slope
  (the profile's, scaled to the runs), not by a measured stage.

The microbatch count is not checked: beyond the growth horizon the law is held, not
extrapolated (sim.costs.growth_factor), and the per-action terms do not depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping, Sequence

from schedules import Program
from schedules.analysis import longest_repeats, switches_stage

TOLD_REPEATS = 3  # the shortest run of repeats that tells the discount (sim.costs.repeat_factor starts there)


@dataclass(frozen=True)
class Coverage:
    """What a calibration's runs held: their rank counts, the layer counts of their stages, the
    longest run of repeats per compute kind (schedules.analysis.run_lengths) and whether any
    rank switched between stages (schedules.analysis.stage_switches)."""

    ranks: tuple[int, ...] = ()
    stage_layers: tuple[int, ...] = ()
    longest_repeats: Mapping[str, int] = field(default_factory=dict)
    stage_switches: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": list(self.ranks), "stage_layers": list(self.stage_layers),
                "longest_repeats": dict(self.longest_repeats), "stage_switches": self.stage_switches}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Coverage":
        return cls(tuple(int(x) for x in data.get("ranks", ())), tuple(int(x) for x in data.get("stage_layers", ())),
                   {str(k): int(v) for k, v in data.get("longest_repeats", {}).items()},
                   bool(data.get("stage_switches", False)))

    @property
    def known(self) -> bool:
        """Whether it records any run (a calibration written before coverage was kept does not)."""
        return bool(self.ranks)


def coverage_of(programs: Sequence[Program], stage_layers: Sequence[Sequence[int]]) -> Coverage:
    """What runs of `programs` hold, `stage_layers[i]` the layer counts of program i's stages."""
    longest: dict[str, int] = {}
    for program in programs:
        for kind, k in longest_repeats(program).items():
            longest[kind] = max(longest.get(kind, 0), k)
    return Coverage(tuple(sorted({p.schedule.ranks for p in programs})),
                    tuple(sorted({int(n) for layers in stage_layers for n in layers})),
                    longest, any(switches_stage(p) for p in programs))


class Topic(Enum):
    """What a note is about."""

    REPEATS_UNTOLD = "repeats, discount not told"
    REPEATS_CARRIED = "repeats, discount carried"
    STAGE_SWITCHES = "stage switches"
    RANKS = "ranks"
    STAGE_SIZES = "stage sizes"


@dataclass(frozen=True)
class Note:
    """One thing a program holds beyond a calibration's runs, and the sentence that says it."""

    topic: Topic
    text: str


def beyond(coverage: Coverage, program: Program, layers: Sequence[int]) -> list[Note]:
    """What `program` (its stages of `layers` layers each) holds beyond `coverage`; nothing
    where the coverage is not known."""
    if not coverage.known:
        return []
    notes = []
    longer = {kind: k for kind, k in sorted(longest_repeats(program).items())
              if k >= TOLD_REPEATS and k > coverage.longest_repeats.get(kind, 0)}
    untold = [kind for kind in longer if coverage.longest_repeats.get(kind, 0) < TOLD_REPEATS]
    carried = [kind for kind in longer if kind not in untold]
    for topic, kinds, why in (
            (Topic.REPEATS_UNTOLD, untold, "what long runs of repeats save is not told, so every repeat is priced "
                                           "at the stage cost"),
            (Topic.REPEATS_CARRIED, carried, "what they save is carried by the law past the runs that told it")):
        if kinds:
            runs = ", ".join(f"{longer[k]} {k}" for k in kinds)
            seen = ", ".join(f"{coverage.longest_repeats.get(k, 0)} {k}" for k in kinds)
            notes.append(Note(topic, f"runs up to {runs} in a row on a rank, the calibration's runs at most {seen}: "
                                     f"{why}"))
    if switches_stage(program) and not coverage.stage_switches:
        notes.append(Note(Topic.STAGE_SWITCHES, "switches between stages on a rank, which none of the calibration's "
                                                "runs did: no cost of such a switch was measured"))
    if program.schedule.ranks not in coverage.ranks:
        held = ", ".join(str(p) for p in coverage.ranks)
        notes.append(Note(Topic.RANKS, f"runs on {program.schedule.ranks} ranks, the calibration's runs on {held}: "
                                       "transfers, shared cores and growth into the step were fitted there"))
    sizes = sorted({int(n) for n in layers} - set(coverage.stage_layers))
    if sizes:
        held = ", ".join(str(n) for n in coverage.stage_layers)
        notes.append(Note(Topic.STAGE_SIZES, f"has stages of {', '.join(str(n) for n in sizes)} layers, the "
                                             f"calibration's runs of {held}: priced by the per-layer slope, not by a "
                                             "measured stage"))
    return notes
