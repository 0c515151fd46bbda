"""zb-auto with this simulator as the evaluator: a CostModel turned into zb-auto's costs,
and the search run with simulated step times (the order logic is schedules.zb_auto's)."""

from __future__ import annotations

from enum import Enum

from schedules import Schedule, build
from schedules.lowering import insert_comms
from schedules.zb_auto import AutoCosts

from .costs import CostModel
from .engine import simulate
from .result import SimResult


class Objective(str, Enum):
    """What the search minimises."""

    MAKESPAN = "makespan"  # the step as this executor runs it (ranks synchronise at its end)
    SPAN = "span"  # the zero-bubble paper's cost: the longest rank span (Sec. 5.3)


def score(result: SimResult, objective: Objective) -> int:
    """The objective's value for one simulation, in nanoseconds (lower is better)."""
    if objective is Objective.SPAN:
        return max(end - start for start, end in result.span_ns)
    return result.makespan_ns


def auto_costs(costs: CostModel, ranks: int, weight_memory: float | None = 1.0) -> AutoCosts:
    """zb-auto's costs for p = `ranks` one-stage ranks under `costs`: F, I, W seconds per
    stage, the mean transfer time over boundaries and directions, and memory in units of
    one microbatch's activations of one rank's share (the simulator's peak_activation unit).

    `weight_memory` is the share of a stage's activations that the plan counts from I until
    W: 1 (default) keeps a microbatch's whole footprint until its W, so the limit bounds the
    simulated peak under any cost model and a measured peak in units of a microbatch's
    largest footprint; None takes the cost model's own weight_memory (bounds the simulated
    peak under this cost model only).
    """
    stage = costs.for_schedule(build("1f1b", ranks=ranks, microbatches=1))
    transfers = stage.send_forward + stage.send_backward
    p2p = sum(transfers) / len(transfers) / 1e9 if transfers else 0.0
    total = sum(stage.memory)
    unit = total / ranks if total else 0.0
    activation = tuple(x / unit if unit else 1.0 for x in stage.memory)
    if weight_memory is None:
        kept = tuple(k / unit if unit else 0.0 for k in stage.weight_memory)
    else:
        kept = tuple(weight_memory * a for a in activation)
    seconds = [tuple(x / 1e9 for x in values) for values in (stage.forward, stage.input, stage.weight)]
    return AutoCosts(*seconds, p2p=p2p, activation=activation, weight_memory=kept)


def auto_schedule(
    costs: CostModel,
    ranks: int,
    microbatches: int,
    memory_limit: float,
    *,
    objective: Objective = Objective.MAKESPAN,
    weight_memory: float | None = 1.0,
    max_evaluations: int = 200,
) -> Schedule:
    """The zb-auto order for `costs` under `memory_limit` (microbatches of one rank's share;
    p is 1F1B's peak, 2p ZB-2p's), searched with simulations under `costs`; validated.
    `weight_memory`: see auto_costs."""
    objective = Objective(objective)
    return build(
        "zb-auto", ranks=ranks, microbatches=microbatches,
        costs=auto_costs(costs, ranks, weight_memory), memory_limit=memory_limit,
        # Candidates are valid by construction and build() validates the one returned, so
        # each is simulated as lowered, without validating it again.
        evaluate=lambda schedule: score(simulate(insert_comms(schedule), costs), objective),
        max_evaluations=max_evaluations,
    )
