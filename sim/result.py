"""What a simulation returns: the timeline and memory tables and the metrics derived from them.

Definitions (p ranks, T the makespan, busy_r the compute time of rank r, i.e. the sum
of its F, B, I and W durations; transfers and receive waits are not compute):

- ``makespan`` T: the time the last rank finishes its stream (all ranks start at 0);
- ``step_time``: T plus the cost model's ``step_overhead`` (what a measured step adds; with a
  ``step_overhead_spread``, the replayed draw's);
- ``idle_r = T - busy_r``;
- ``bubble_ratio = sum_r idle_r / (p * T)``: the share of the p x T device-time box
  spent not computing (the GPipe / zero-bubble paper's definition);
- ``bubble_fraction = sum_r idle_r / sum_r busy_r``: idle time relative to the ideal
  (bubble-free) compute time, as Megatron-LM states it ((p-1)/m for 1F1B);
- ``bubble_ratio_rank_span = (max_r span_r - max_r busy_r) / max_r span_r``, the
  zero-bubble paper's bubble rate (Qi et al., ICLR 2024, Sec. 5.3: (cost - m(T_F+T_B+T_W))
  / cost with cost the largest execution time of all stages), where span_r runs from the
  start of rank r's first compute action to the end of its last one. It leaves out the
  time before a rank's first compute (waiting for the pipeline to fill) and after its
  last (waiting for the others to drain). ``rank_span_bubbles[r] = (span_r - busy_r) /
  span_r`` per rank; ``span_idle[r] = span_r - busy_r``; ``span`` gives span_r. Closed
  forms stated per rank span, such as ZB-H2's (p-1)(T_F+T_B-2T_W), are rank 0's
  ``span_idle`` (the largest). It is never larger than bubble_ratio (max_r busy_r is at
  least the mean busy time and max_r span_r at most the makespan);
- ``peak_activation_bytes[r]``: the most activation bytes rank r holds at once;
  ``peak_activation[r]`` is the same in units of one microbatch's activations of one
  rank's share of the model (the sum of all stages' activation bytes divided by p), so
  GPipe gives m, 1F1B gives min(p-r, m).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pandas as pd

from schedules import Action, Kind, Program
from schedules import timeline as schema
from schedules.timeline import memory_frame, timeline_frame

from .costs import NS_PER_S, CostModel, ResolvedCosts
from .metrics import step_spread


@dataclass
class RankRecord:
    """What the engine records for one rank (integers: nanoseconds and bytes)."""

    times: list[int] = field(default_factory=list)  # start, end of each finished action
    memory: list[tuple[int, int]] = field(default_factory=list)  # (time, bytes held after)
    busy: int = 0  # total compute time
    first: int = -1  # start of the first compute action (-1: none)
    last: int = 0  # end of the last compute action
    peak: int = 0  # most activation bytes held at once
    work: int = 0  # where compute grows into the step: its compute work done (ns on a processor of its own)


@dataclass(frozen=True, eq=False)
class SimResult:
    """A simulated step: tables (schema of schedules.timeline, times in seconds) and metrics.

    Integer fields end in ``_ns`` (nanoseconds); the properties give seconds. The
    `timeline` and `memory` DataFrames are built on first access (metrics do not need
    them, and a sweep never looks at them).
    """

    program: Program
    costs: CostModel
    resolved: ResolvedCosts  # `costs` resolved for the program's stages (ns, bytes)
    records: tuple[RankRecord, ...] = field(repr=False)
    makespan_ns: int
    busy_ns: tuple[int, ...]
    span_ns: tuple[tuple[int, int], ...]  # per rank: (first compute start, last compute end)
    peak_bytes: tuple[int, ...]
    overhead_ns: int = 0  # what the step takes beyond the makespan (the drawn one with a spread)
    # with a spread: every draw's step time, ascending (the result is the median draw's); () without
    draw_step_times_ns: tuple[int, ...] = ()

    @classmethod
    def from_records(
        cls, program: Program, costs: CostModel, resolved: ResolvedCosts, records: list[RankRecord],
        overhead_ns: int | None = None, draw_step_times_ns: tuple[int, ...] = (),
    ) -> "SimResult":
        """Derive the metrics from the engine's per-rank records; `overhead_ns`: the step
        overhead of the replayed draw (default the cost model's ``step_overhead``);
        `draw_step_times_ns`: every draw's step time where the costs have a spread."""
        return cls(
            program=program,
            costs=costs,
            resolved=resolved,
            records=tuple(records),
            # max, not the last: a gradient reduction may end after the actions after it
            makespan_ns=max((max(r.times) for r in records if r.times), default=0),
            busy_ns=tuple(r.busy for r in records),
            span_ns=tuple((max(r.first, 0), r.last) for r in records),
            peak_bytes=tuple(r.peak for r in records),
            overhead_ns=resolved.step_overhead if overhead_ns is None else overhead_ns,
            draw_step_times_ns=tuple(draw_step_times_ns),
        )

    @cached_property
    def timeline(self) -> pd.DataFrame:
        """One row per action (schema: schedules.timeline), source "sim", step 0."""
        return timeline_frame(_timeline_rows(self.program, self.records))

    @cached_property
    def memory(self) -> pd.DataFrame:
        """Activation bytes held per rank: a row at time 0, then one per change."""
        rows = []
        for rank, record in enumerate(self.records):
            rows.append((0, rank, 0.0, 0, "sim"))
            rows += [(0, rank, t / NS_PER_S, b, "sim") for t, b in record.memory]
        return memory_frame(rows)

    @property
    def ranks(self) -> int:
        return self.program.ranks

    @property
    def makespan(self) -> float:
        return self.makespan_ns / NS_PER_S

    @property
    def step_time(self) -> float:
        """Predicted step time, seconds: the makespan plus the step overhead (the cost model's
        ``step_overhead``, times the replayed draw's factor with a ``step_overhead_spread``)."""
        return (self.makespan_ns + self.overhead_ns) / NS_PER_S

    @property
    def step_time_spread(self) -> float:
        """How much the step times of the spread's draws vary: interquartile range over median, as
        a measured run's (sim.metrics.step_spread); 0 without a spread. What a run of this program
        on the calibrated machine would show if its steps varied as the calibration's runs did."""
        return step_spread(self.draw_step_times_ns)

    @property
    def busy(self) -> list[float]:
        """Compute time per rank, seconds."""
        return [b / NS_PER_S for b in self.busy_ns]

    @property
    def idle(self) -> list[float]:
        """Makespan minus compute time, per rank, seconds."""
        return [(self.makespan_ns - b) / NS_PER_S for b in self.busy_ns]

    @property
    def span(self) -> list[float]:
        """Per rank, seconds from its first compute start to its last compute end."""
        return [(end - start) / NS_PER_S for start, end in self.span_ns]

    @property
    def span_idle(self) -> list[float]:
        """Per rank, idle seconds inside its span (the zero-bubble paper's per-stage bubble)."""
        return [(end - start - b) / NS_PER_S for (start, end), b in zip(self.span_ns, self.busy_ns)]

    @property
    def bubble_ratio(self) -> float:
        """Total idle compute time over p x makespan (0 when the makespan is 0)."""
        return schema.bubble_ratio(self.ranks, self.makespan_ns, sum(self.busy_ns))

    @property
    def bubble_fraction(self) -> float:
        """Total idle time over total compute time, Megatron-LM style (0 without compute)."""
        busy = sum(self.busy_ns)
        return (self.ranks * self.makespan_ns - busy) / busy if busy else 0.0

    @property
    def bubble_ratio_rank_span(self) -> float:
        """The zero-bubble paper's bubble rate: longest rank span minus the busiest rank's
        compute, over the longest span (0 if spans are 0)."""
        return schema.bubble_ratio_rank_span(self._spans_ns, self.busy_ns)

    @property
    def rank_span_bubbles(self) -> list[float]:
        """Per rank, idle time inside its own span over that span."""
        return schema.rank_span_bubbles(self._spans_ns, self.busy_ns)

    @property
    def _spans_ns(self) -> list[int]:
        return [end - start for start, end in self.span_ns]

    @property
    def peak_activation_bytes(self) -> list[int]:
        return list(self.peak_bytes)

    @property
    def activation_unit_bytes(self) -> float:
        """Bytes of one microbatch's activations of one rank's share: all stages' / p."""
        return sum(self.resolved.memory) / self.ranks

    @property
    def peak_activation(self) -> list[float]:
        """Peak activation per rank in rank-share microbatch units (0 if no activation memory)."""
        total = sum(self.resolved.memory)
        return [b * self.ranks / total if total else 0.0 for b in self.peak_bytes]

    @property
    def static_bytes(self) -> list[int]:
        return list(self.resolved.static)

    @property
    def peak_memory_bytes(self) -> list[int]:
        """Peak activation bytes plus static bytes, per rank."""
        return [a + s for a, s in zip(self.peak_bytes, self.resolved.static)]

    @property
    def time_per_microbatch(self) -> float:
        return self.makespan / self.program.schedule.microbatches

    def summary(self) -> dict[str, Any]:
        """One JSON-ready record: sizes and the headline metrics (what `sim compare` prints)."""
        schedule = self.program.schedule
        return {
            "schedule": schedule.name,
            "ranks": schedule.ranks,
            "microbatches": schedule.microbatches,
            "chunks": schedule.chunks,
            "makespan": self.makespan,
            "step_time": self.step_time,
            "step_time_spread": self.step_time_spread,
            "time_per_microbatch": self.time_per_microbatch,
            "bubble_ratio": self.bubble_ratio,
            "bubble_ratio_rank_span": self.bubble_ratio_rank_span,
            "rank_span_bubbles": self.rank_span_bubbles,
            "bubble_fraction": self.bubble_fraction,
            "peak_activation": max(self.peak_activation),
            "peak_activation_per_rank": self.peak_activation,
            "peak_activation_bytes": max(self.peak_bytes),
            "peak_activation_bytes_per_rank": self.peak_activation_bytes,
        }


def _timeline_rows(program: Program, records: tuple[RankRecord, ...]):
    """Timeline rows in TIMELINE_COLUMNS order, rank by rank in stream order."""
    schedule = program.schedule
    n = schedule.num_stages
    s2r = schedule.stage_to_rank
    chunk_of = [schedule.chunk_of(stage) for stage in range(n)]
    # Per kind: its text and the offset of the peer stage (None for compute). Looked up
    # once per kind because Enum properties are slow in a loop over every action.
    label = {kind: kind.value for kind in Kind}
    peer_offset = {kind: (Action(n, kind, 0).peer_stage() - n if kind.is_comm else None) for kind in Kind}
    for rank, (stream, record) in enumerate(zip(program.streams, records)):
        flat = record.times
        for i, action in enumerate(stream):
            kind, stage, mb = action.kind, action.stage, action.microbatch
            offset = peer_offset[kind]
            text = label[kind]
            yield (
                0, rank, stage, chunk_of[stage], mb, text, f"{stage}{text}{mb}" if mb >= 0 else f"{stage}{text}",
                flat[2 * i] / NS_PER_S, flat[2 * i + 1] / NS_PER_S,
                -1 if offset is None else s2r[stage + offset], "sim",
            )
