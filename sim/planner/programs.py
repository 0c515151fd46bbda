"""Built and lowered programs per pipeline shape, kept for the whole search.

A search visits many configurations that share a pipeline shape (schedule, p, m, v): they
differ in costs only (tensor parallel size, recomputation, ZeRO, ...). `ProgramCache`
generates each shape once; it checks and lowers (schedules.lower: rules, lowering and the
deadlock check, once) only the shapes that fit in memory and get simulated, and derives two
order-only facts from the generator's output:

- the stage-to-rank placement (from a small build: placement depends on p and v only);
- the *occupancy* of each rank: after each forward and each I (the actions that allocate:
  I does when W keeps more than F saved), how many microbatches of each of its stages hold
  their full activations and how many hold what W needs (split backward). The engine
  allocates at F (and I) and frees at B / I / W in
  each rank's stream order (sim.engine), so a rank's activation bytes over time, and their
  peak, are a function of this order and the bytes per stage alone: `activation_peaks`
  gives the engine's `SimResult.peak_bytes` without simulating (a test checks they agree),
  which lets the search discard configurations that do not fit before it simulates them.
  Storage two stages on one rank share (sim.handover: a calibration of a model whose stage
  saves its own output) only lowers the engine's peak, so there this is an upper bound.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

import schedules
from schedules import Kind, Program, Schedule


@dataclass(frozen=True)
class Shape:
    """What a pipeline program depends on."""

    schedule: str
    ranks: int
    microbatches: int
    chunks: int


@dataclass(frozen=True)
class Occupancy:
    """Per rank: its stages and, after each forward and each I, the count of microbatches per
    stage holding full activations (first len(stages) columns) and holding W's bytes (the rest)."""

    stages: tuple[tuple[int, ...], ...]
    counts: tuple[np.ndarray, ...]


def _chunks_argument(name: str, chunks: int) -> int | None:
    return None if schedules.generator(name).chunks is not None else chunks


class ProgramCache:
    """Programs, placements and occupancies by shape; `capacity` programs are kept at once."""

    def __init__(self, capacity: int = 48):
        self.capacity = capacity
        self._programs: OrderedDict[Shape, Program] = OrderedDict()
        self._occupancy: dict[Shape, Occupancy] = {}
        self._generated: OrderedDict[Shape, Schedule] = OrderedDict()  # the last few, unchecked
        self._placements: dict[tuple[str, int, int], tuple[int, ...]] = {}
        self._refused: dict[Shape, str] = {}
        self.builds = 0
        self.build_seconds = 0.0

    def program(self, shape: Shape) -> Program:
        """The lowered program of `shape`; ScheduleError if the schedule refuses the sizes."""
        if shape in self._refused:
            raise schedules.ScheduleError(self._refused[shape])
        program = self._programs.get(shape)
        if program is not None:
            self._programs.move_to_end(shape)
            return program
        schedule = self._generated.pop(shape, None) or self._generate(shape)
        start = time.perf_counter()
        try:
            program = schedules.lower(schedule)  # checks the generator's output once, lowers it once
        except schedules.ScheduleError as exc:
            self._refused[shape] = str(exc)
            raise
        finally:
            self.build_seconds += time.perf_counter() - start
        self.builds += 1
        self._programs[shape] = program
        if len(self._programs) > self.capacity:
            self._programs.popitem(last=False)
        return program

    def _generate(self, shape: Shape) -> Schedule:
        """The generator's unchecked output for `shape`; ScheduleError (remembered) if it refuses."""
        gen = schedules.generator(shape.schedule)
        start = time.perf_counter()
        try:
            return gen.make(shape.ranks, shape.microbatches, gen.resolve_chunks(_chunks_argument(shape.schedule, shape.chunks)))
        except schedules.ScheduleError as exc:
            self._refused[shape] = str(exc)
            raise
        finally:
            self.build_seconds += time.perf_counter() - start

    def placement(self, name: str, ranks: int, chunks: int) -> tuple[int, ...]:
        """stage_to_rank of schedule `name` at p ranks and v chunks (from a build at m = 2p)."""
        key = (name, ranks, chunks)
        if key not in self._placements:
            small = schedules.generator(name).make(ranks, 2 * ranks, schedules.generator(name).resolve_chunks(
                _chunks_argument(name, chunks)))
            self._placements[key] = small.stage_to_rank
        return self._placements[key]

    def occupancy(self, shape: Shape) -> Occupancy:
        """Order-only activation occupancy of `shape` (module docstring); ScheduleError if the
        schedule refuses the sizes."""
        if shape in self._refused:
            raise schedules.ScheduleError(self._refused[shape])
        if shape not in self._occupancy:
            program = self._programs.get(shape)
            if program is not None:
                schedule = program.schedule
            else:
                # Kept for program(): a shape whose occupancy fits is lowered right after.
                schedule = self._generated[shape] = self._generate(shape)
                if len(self._generated) > 4:
                    self._generated.popitem(last=False)
            self._occupancy[shape] = _occupancy(schedule)
        return self._occupancy[shape]


def _occupancy(schedule: Schedule) -> Occupancy:
    stages_of = schedule.rank_stages
    counts = []
    for rank, order in enumerate(schedule.order):
        local = {stage: i for i, stage in enumerate(stages_of[rank])}
        width = len(local)
        state = [0] * (2 * width)
        rows = []
        for action in order:
            i = local[action.stage]
            kind = action.kind
            if kind is Kind.F:
                state[i] += 1
                rows.append(tuple(state))
            elif kind is Kind.B:
                state[i] -= 1
            elif kind is Kind.I:
                state[i] -= 1
                state[width + i] += 1
                rows.append(tuple(state))  # the peak when W keeps more than F saved
            elif kind is Kind.W:
                state[width + i] -= 1
        counts.append(np.unique(np.array(rows, dtype=np.int64).reshape(-1, 2 * width), axis=0))
    return Occupancy(tuple(stages_of), tuple(counts))


def activation_peaks(occupancy: Occupancy, memory: tuple[int, ...], kept: tuple[int, ...]) -> list[int]:
    """Peak activation bytes per rank, for `memory[s]` bytes per microbatch of stage s held from
    F, of which `kept[s]` stay from I until W: the engine's peak, computed from the order alone."""
    peaks = []
    for stages, counts in zip(occupancy.stages, occupancy.counts):
        if counts.size == 0:
            peaks.append(0)
            continue
        weights = np.array([memory[s] for s in stages] + [kept[s] for s in stages], dtype=np.int64)
        peaks.append(int((counts @ weights).max()))
    return peaks
