"""The two containers of the IR: a Schedule (compute order) and a Program (lowered streams)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from .ir import Action, Kind
from .placement import name_of


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule: sizes, placement and the per-rank order of compute actions.

    `order[r]` lists rank r's F/B/I/W actions in the order it runs them.
    `stage_to_rank[s]` is the rank that holds stage s; there are ranks*chunks stages.
    """

    name: str
    ranks: int
    microbatches: int
    chunks: int
    stage_to_rank: tuple[int, ...]
    order: tuple[tuple[Action, ...], ...]

    @property
    def num_stages(self) -> int:
        return len(self.stage_to_rank)

    @property
    def placement(self) -> str:
        return name_of(self.stage_to_rank, self.ranks)

    @cached_property
    def rank_stages(self) -> tuple[tuple[int, ...], ...]:
        """Stages held by each rank, in increasing stage order."""
        held: list[list[int]] = [[] for _ in range(self.ranks)]
        for stage, rank in enumerate(self.stage_to_rank):
            held[rank].append(stage)
        return tuple(tuple(s) for s in held)

    def chunk_of(self, stage: int) -> int:
        """Index of `stage` among the stages of its rank (0 for the first it holds)."""
        return self.rank_stages[self.stage_to_rank[stage]].index(stage)

    @property
    def uses_split_backward(self) -> bool:
        """Whether any backward is split into I and W."""
        return any(a.kind in (Kind.I, Kind.W) for row in self.order for a in row)

    def describe(self) -> str:
        return (
            f"{self.name} (p={self.ranks}, m={self.microbatches}, v={self.chunks}, "
            f"{self.placement} placement)"
        )


@dataclass(frozen=True)
class Program:
    """A lowered schedule: per-rank streams of compute and point-to-point actions.

    This is what the simulator and the executor walk, action by action.
    """

    schedule: Schedule
    streams: tuple[tuple[Action, ...], ...] = field(repr=False)

    @property
    def ranks(self) -> int:
        return self.schedule.ranks

    @property
    def num_actions(self) -> int:
        return sum(len(s) for s in self.streams)
