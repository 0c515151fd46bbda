"""The idle share of ranks sharing cores, chosen by the calibration runs' own step times.

Where a run's ranks share fewer cores than there are ranks (4 ranks on 2 cores), the share of
a core a rank takes while it does not compute (sim.costs ``idle_share``) decides how much
faster a pipeline's fill and drain, where few ranks compute, run than its steady state. The
calibration's own criterion (`sim.calibration.fit_idle_share`: the share under which each
cell's actions come out most alike on a core of their own) hardly tells shares apart when the
actions' own noise is large, and on the mlp runs of sweeps 9 and 10 it chose 0.85-1, under
which the three-run calibrations replayed their own runs 4-10% short and predicted every
m = 4p run short. A share is a claim about step times, so it is chosen here by them: of the
candidates, the one whose calibration (every other parameter fitted under it) replays the
calibration runs' median step times best (least mean squared log error). This needs only the
calibration runs, and a replay per candidate; the transfers' fit, the slow part of a
calibration, does not depend on the share and is made once (`TransferFits`). This module holds
the search (`choose_share`) and its criterion (`replay_error`); `sim.calibration.calibrate_runs`
fits each candidate and calls them, so that every calibration, from the library or from
``sim calibrate``, chooses alike.

One program's own step time says less than several programs': the calibration takes each
action's time on a core of its own by inverting the sharing law at the candidate share and the
replay applies the same law, so a noise-free synthetic 1F1B run made at share 0.35 or 0.6
replays within 0.1-1.4% at any share (exactly only at its own). Programs whose ranks overlap
differently (1F1B, ZB-H1, interleaved) cannot all be replayed by one set of costs under a
wrong share (the same runs with an interleaved one: 0.2-2.3% off at the wrong shares, 0 at the
right one, unimodal). On measured runs a single program discriminates more, through the
spreads and cell means fitted under the share (sweep 11's p=4 1F1B runs: 2-5 points between
the best and worst share), and choosing by it predicted held-out runs better at gpt 8 and mlp
256 rows p=4 and about as well at mlp 8 rows (bench/fidelity_sweeps.md, "Sweep 11"), so a single
program is chosen for too. The replay error is not unimodal in the share (a measured run: 0.7%
at 0, 2.6% at 0.5, 1.2% at 1), so the whole grid is scanned at 0.1 before refining.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence, TypeVar

import numpy as np

from .costs import CostModel
from .engine import simulate
from .measured import MeasuredRun

IDLE_SHARES = tuple(i / 20 for i in range(21))  # the shares a choice can make: 0, 0.05, ..., 1
COARSE = tuple(i / 10 for i in range(11))  # the whole grid first; then the best's neighbours at 0.05

Fitted = TypeVar("Fitted")


def replay_error(costs_for: Callable[[MeasuredRun], CostModel], runs: Sequence[MeasuredRun]) -> float:
    """Root mean square over `runs` of log(simulated / measured median step time), each run
    simulated under ``costs_for(run)`` (a calibration's `for_run`)."""
    logs = [math.log(simulate(run.program, costs_for(run)).step_time / run.step_time_median) for run in runs]
    return float(np.sqrt(np.mean(np.square(logs))))


def choose_share(fit: Callable[[float], Fitted], error: Callable[[Fitted], float]
                 ) -> tuple[float, dict[float, tuple[float, Fitted]]]:
    """The share of IDLE_SHARES whose fit (``fit(share)``) has the least ``error``: COARSE first,
    then the best one's neighbours at 0.05 (module docstring); ties go to the smaller share.
    Returns it and every share tried with its (error, fit)."""
    tried: dict[float, tuple[float, Fitted]] = {}

    def attempt(share: float) -> None:
        share = min(IDLE_SHARES, key=lambda s: abs(s - share))  # the grid's own value
        if share not in tried:
            fitted = fit(share)
            tried[share] = (error(fitted), fitted)

    def best() -> float:
        return min(tried, key=lambda s: (tried[s][0], s))

    for share in COARSE:
        attempt(share)
    centre = best()
    for share in (centre - 0.05, centre + 0.05):
        if 0.0 <= share <= 1.0:
            attempt(share)
    return best(), tried
