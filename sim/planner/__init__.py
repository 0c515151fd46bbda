"""Planning a training run: which data, tensor and pipeline parallelism (with ZeRO, recomputation,
sequence parallelism, schedule, microbatches) trains a model fastest on a cluster, by simulation.

Entry points: `plan(PlanRequest(...))` ranks configurations (sim.planner.search); `load_model`,
`make_cluster` build its inputs; sim.planner.report formats the answer.
"""

from .cluster import Cluster, make_cluster
from .config import Config, Space
from .errors import PlanError
from .models import PRESETS, Transformer, load_model
from .search import Evaluation, Plan, PlanRequest, plan

__all__ = [
    "Cluster", "Config", "Evaluation", "PRESETS", "Plan", "PlanError", "PlanRequest", "Space", "Transformer",
    "load_model", "make_cluster", "plan",
]
