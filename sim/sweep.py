"""Simulate many configurations (schedule, p, m, v) under one cost source into one table.

The cost source (sim.costs.CostSource) gives each configuration the cost model of its
own stages: a `CostModel` is the same for all, a `Calibration` cuts its model into each
schedule's stages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import pandas as pd

import schedules
from schedules import Schedule, ScheduleError

from .costs import CostError, CostModel, CostSource
from .engine import simulate
from .result import SimResult
from .zb_search import auto_schedule

# The schedule whose order is searched from the cost model (under a memory limit) rather than
# generated from the sizes alone.
AUTO = "zb-auto"

# One row per configuration; every column is a scalar so the table reads back from CSV as is.
TABLE_COLUMNS: tuple[str, ...] = (
    "schedule", "ranks", "microbatches", "chunks", "makespan", "time_per_microbatch", "bubble_ratio",
    "bubble_ratio_rank_span", "bubble_fraction", "peak_activation", "peak_microbatches", "peak_activation_bytes",
    "actions",
)


@dataclass(frozen=True)
class Config:
    """One point of a sweep; chunks is None for schedules with a fixed chunk count."""

    schedule: str
    ranks: int
    microbatches: int
    chunks: int | None

    def __str__(self) -> str:
        v = "" if self.chunks is None else f", v={self.chunks}"
        return f"{self.schedule} (p={self.ranks}, m={self.microbatches}{v})"


def combinations(
    names: Sequence[str], ranks: Sequence[int], microbatches: Sequence[int], chunks: Sequence[int]
) -> list[Config]:
    """Every combination (the cartesian product), in the order given; `chunks` only varies
    schedules that take a chunk count. Unknown schedule names raise ScheduleError."""
    found: list[Config] = []
    for name in names:
        takes_chunks = schedules.generator(name).takes_chunks
        for p in ranks:
            for m in microbatches:
                for v in (chunks if takes_chunks else [None]):
                    config = Config(name, p, m, v)
                    if config not in found:
                        found.append(config)
    return found


def build(config: Config, costs: CostSource | None = None, memory_limit: float | None = None) -> Schedule:
    """The validated schedule of a configuration; ScheduleError if it is illegal.

    zb-auto is searched with simulations under `costs` (when given; its generator's equal unit
    costs otherwise) and capped at `memory_limit` microbatches of one rank's share (default p,
    1F1B's memory); the other schedules ignore both."""
    if config.schedule == AUTO and costs is not None:
        limit = float(config.ranks) if memory_limit is None else memory_limit
        return auto_schedule(costs.for_stages(config.ranks), config.ranks, config.microbatches, limit)
    if config.schedule == AUTO and memory_limit is not None:
        return schedules.build(AUTO, ranks=config.ranks, microbatches=config.microbatches, memory_limit=memory_limit)
    return schedules.build(config.schedule, ranks=config.ranks, microbatches=config.microbatches, chunks=config.chunks)


def row(schedule: Schedule, costs: CostModel, source: CostSource | None = None) -> dict:
    """One table row: SimResult.summary() of one simulation of `schedule`, plus the number of
    lowered actions, `peak_microbatches` (see `peak_microbatches`) and what the program holds
    beyond the runs `source` (the calibration `costs` came from, default `costs` itself) was
    measured on ("beyond_calibration": topic and note each, sim.coverage)."""
    result = simulate(schedule, costs)
    own = peak_microbatches(result)
    notes = (source or costs).beyond(result.program)
    return {**result.summary(), "peak_microbatches": max(own), "peak_microbatches_per_rank": own,
            "actions": result.program.num_actions,
            "beyond_calibration": [{"topic": note.topic.value, "note": note.text} for note in notes]}


def peak_microbatches(result: SimResult) -> list[float]:
    """Per rank, its peak activation bytes over the bytes one microbatch leaves on that rank's own
    stages: how many microbatches' activations it holds at once (GPipe: m on every rank, 1F1B:
    min(p-r, m)), whatever the stages weigh. `peak_activation` divides by the mean rank's share
    instead, which a rank holding heavier stages (an embedding, an LM head) exceeds."""
    own = [0] * result.ranks
    for stage, size in enumerate(result.resolved.memory):
        own[result.program.schedule.stage_to_rank[stage]] += size
    return [peak / size if size else 0.0 for peak, size in zip(result.peak_bytes, own)]


def table(records: Iterable[dict]) -> pd.DataFrame:
    """The scalar columns (TABLE_COLUMNS) of summaries, one row each."""
    return pd.DataFrame([{c: r[c] for c in TABLE_COLUMNS} for r in records], columns=list(TABLE_COLUMNS))


def simulate_all(
    configs: Iterable[Config],
    costs: CostSource,
    progress: Callable[[Iterable[Config]], Iterable[Config]] = lambda it: it,
    memory_limit: float | None = None,
) -> tuple[pd.DataFrame, list[tuple[Config, str]], list[str]]:
    """Simulate every configuration; returns the table, the (config, reason) pairs skipped
    (see `simulate_records`) and the lines that say what configurations hold beyond a
    calibration's runs (`note_lines`, for `sim sweep`)."""
    records, skipped = simulate_records(configs, costs, progress, memory_limit)
    return table(records), skipped, note_lines(records, "sim sweep")


def simulate_records(
    configs: Iterable[Config],
    costs: CostSource,
    progress: Callable[[Iterable[Config]], Iterable[Config]] = lambda it: it,
    memory_limit: float | None = None,
) -> tuple[list[dict], list[tuple[Config, str]]]:
    """Simulate every configuration; returns one `row` each (with what its program holds beyond
    a calibration's runs; nothing for a cost model), and the (config, reason) pairs skipped
    because the schedule cannot run at those sizes, or because a calibration cannot cut its model
    into that many stages. A cost model that does not fit a schedule (CostError) is not skipped:
    it propagates. `memory_limit` caps zb-auto (see build)."""
    records, skipped = [], []
    for config in progress(configs):
        try:
            schedule = build(config, costs, memory_limit)
            model = costs.for_stages(schedule.num_stages)
        except (ScheduleError, CostError) as exc:
            skipped.append((config, str(exc)))
            continue
        records.append(row(schedule, model, costs))
    return records, skipped


def note_lines(records: Iterable[dict], command: str) -> list[str]:
    """One line per topic of the records' notes (`simulate_records`' "beyond_calibration",
    sim.coverage): how many configurations it was given to, with the first one's note."""
    given: dict[str, list[tuple[str, str]]] = {}
    for r in records:
        config = f"{r['schedule']} (p={r['ranks']}, m={r['microbatches']}, v={r['chunks']})"
        for entry in r["beyond_calibration"]:
            given.setdefault(entry["topic"], []).append((config, entry["note"]))
    return [f"{command}: beyond the calibration's runs ({topic}) for {len(found)} configuration(s), e.g. "
            f"{found[0][0]} {found[0][1]}" for topic, found in given.items()]


def simulate_each(names: Sequence[str], ranks: int, microbatches: int, chunks: int | None,
                  costs: CostSource, memory_limit: float | None = None) -> dict[str, SimResult]:
    """Simulate each named schedule at one size (`chunks` only where a schedule takes it;
    `memory_limit` caps zb-auto, see build); raises ScheduleError naming a bad one."""
    results = {}
    for name in names:
        if name == AUTO:
            schedule = build(Config(name, ranks, microbatches, None), costs, memory_limit)
        else:
            schedule = schedules.build_for(name, ranks, microbatches, chunks)
        results[name] = simulate(schedule, costs.for_stages(schedule.num_stages))
    return results
