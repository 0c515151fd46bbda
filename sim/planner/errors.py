"""The one error the planner raises for input it cannot plan with."""

from __future__ import annotations


class PlanError(ValueError):
    """Bad or infeasible planning input; the message is one line naming the shortfall."""
