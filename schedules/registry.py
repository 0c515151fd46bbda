"""Schedules by name: each generator module registers itself here."""

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
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ScheduleError(
            f"unknown schedule {name!r}; available: {', '.join(available())}"
        ) from None


def build(name: str, ranks: int, microbatches: int, chunks: int | None = None, **options) -> Schedule:
    """Generate and validate the schedule `name`; raises ScheduleError on illegal sizes."""
    from .validate import validate

    gen = generator(name)
    for label, value in (("ranks", ranks), ("microbatches", microbatches)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ScheduleError(f"{label} must be a positive integer; got {value!r}")
    if chunks is not None and (not isinstance(chunks, int) or chunks < 1):
        raise ScheduleError(f"chunks must be a positive integer; got {chunks!r}")
    schedule = gen.make(ranks, microbatches, gen.resolve_chunks(chunks), **options)
    validate(schedule)
    return schedule
