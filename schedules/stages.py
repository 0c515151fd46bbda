"""What each stage of a pipeline holds: its role (which ends of the model) and its layers.

A model that a pipeline cuts into stages has a prologue (e.g. an embedding) before its
layers and an epilogue (norm, LM head, the loss) after them; the first stage holds the
prologue, the last the epilogue. The executor (which modules a stage runs, the profile's
stage roles) and the simulator's calibration (a fixed cost per role; a balanced cut of
the same model into another number of stages) both read these facts here.
"""

from __future__ import annotations

from enum import Enum


class Role(str, Enum):
    """The role of a stage; its value is the name profile.json and calibrations write."""

    FIRST = "first"  # holds the prologue; computes no input gradient
    MIDDLE = "middle"
    LAST = "last"  # holds the epilogue and the loss
    ONLY = "only"  # a one-stage pipeline: both ends

    @property
    def holds_prologue(self) -> bool:
        return self in (Role.FIRST, Role.ONLY)

    @property
    def holds_epilogue(self) -> bool:
        return self in (Role.LAST, Role.ONLY)


ROLES: tuple[Role, ...] = tuple(Role)


def role_of(stage: int, num_stages: int) -> Role:
    """The role of `stage` in a pipeline of `num_stages` stages."""
    if num_stages == 1:
        return Role.ONLY
    return Role.FIRST if stage == 0 else Role.LAST if stage == num_stages - 1 else Role.MIDDLE


def roles(num_stages: int) -> tuple[Role, ...]:
    """The roles a pipeline of `num_stages` stages has, in pipeline order."""
    return (Role.ONLY,) if num_stages == 1 else (Role.FIRST, Role.MIDDLE, Role.LAST)


def balanced_layers(num_layers: int, num_stages: int) -> tuple[tuple[int, int], ...]:
    """Per stage, its [first, last + 1) layer range when `num_layers` layers are cut evenly
    by count: floor(L/S) layers each, the first L mod S stages one more (the executor's
    default cut). Needs 1 <= num_stages <= num_layers (callers say why not in their terms)."""
    if not 1 <= num_stages <= num_layers:
        raise ValueError(f"cannot cut {num_layers} layers into {num_stages} non-empty stages")
    base, extra = divmod(num_layers, num_stages)
    bounds = [0]
    for s in range(num_stages):
        bounds.append(bounds[-1] + base + (1 if s < extra else 0))
    return tuple((bounds[s], bounds[s + 1]) for s in range(num_stages))
