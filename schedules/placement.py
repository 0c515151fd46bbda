"""Stage-to-rank placements: which rank holds which pipeline stage."""

from __future__ import annotations

from .errors import ScheduleError


def looped(ranks: int, chunks: int) -> tuple[int, ...]:
    """Rank r holds stages r, r+p, r+2p, ... (Megatron-LM's interleaved placement)."""
    _check(ranks, chunks)
    return tuple(stage % ranks for stage in range(ranks * chunks))


def vshape(ranks: int) -> tuple[int, ...]:
    """Rank r holds stages r and 2p-1-r: the pipeline goes down the ranks and back up."""
    _check(ranks, 2)
    return tuple(s if s < ranks else 2 * ranks - 1 - s for s in range(2 * ranks))


def name_of(stage_to_rank: tuple[int, ...], ranks: int) -> str:
    """'looped', 'v' or 'custom' for a stage-to-rank tuple."""
    chunks, rest = divmod(len(stage_to_rank), ranks)
    if rest == 0 and chunks >= 1 and stage_to_rank == looped(ranks, chunks):
        return "looped"
    if chunks == 2 and stage_to_rank == vshape(ranks):
        return "v"
    return "custom"


def _check(ranks: int, chunks: int) -> None:
    if ranks < 1:
        raise ScheduleError(f"ranks must be at least 1, got {ranks}")
    if chunks < 1:
        raise ScheduleError(f"chunks must be at least 1, got {chunks}")
