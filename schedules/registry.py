"""Schedules by name: each generator module registers itself here (schedules.checked builds them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .errors import ScheduleError
from .schedule import Schedule


@dataclass(frozen=True)
class Generator:
    """A registered schedule generator.

    `chunks` is the fixed number of stages per rank the schedule uses (1 for GPipe and
    1F1B, 2 for V-shaped schedules), or None when it takes `chunks` as a parameter
    (at least `min_chunks`).
    """

    name: str
    make: Callable[..., Schedule]
    summary: str
    chunks: int | None = 1
    min_chunks: int = 1

    @property
    def takes_chunks(self) -> bool:
        """Whether the schedule takes a chunk count (else it runs its own fixed one)."""
        return self.chunks is None

    def resolve_chunks(self, chunks: int | None) -> int:
        if self.chunks is not None:
            if chunks is not None and chunks != self.chunks:
                raise ScheduleError(
                    f"{self.name} runs {self.chunks} stage(s) per rank; got chunks={chunks}"
                )
            return self.chunks
        value = 2 if chunks is None else chunks
        if value < self.min_chunks:
            raise ScheduleError(f"{self.name} needs chunks >= {self.min_chunks}; got chunks={value}")
        return value


_REGISTRY: dict[str, Generator] = {}


def register(name: str, summary: str, chunks: int | None = 1, min_chunks: int = 1):
    """Decorator: register `make(ranks, microbatches, chunks, **options) -> Schedule`."""

    def wrap(make: Callable[..., Schedule]) -> Callable[..., Schedule]:
        if name in _REGISTRY:
            raise ValueError(f"schedule {name!r} registered twice")
        _REGISTRY[name] = Generator(name, make, summary, chunks, min_chunks)
        return make

    return wrap


def available() -> list[str]:
    """Names of the registered schedules, in registration order."""
    return list(_REGISTRY)


def generator(name: str) -> Generator:
    """The registered generator `name`; ScheduleError naming the available ones otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ScheduleError(
            f"unknown schedule {name!r}; available: {', '.join(available())}"
        ) from None
