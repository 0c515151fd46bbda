"""Planning with a calibration of a measured run (`python -m sim calibrate`) as the cost source.

On a machine without GPUs the executor (`python -m runtime`) runs the pipeline axis of the
built-in gpt model on CPU ranks; `sim calibrate` fits the simulator to one such run. A plan
for that model on those ranks takes every per-stage cost (compute, transfers, executor
overheads, activation bytes) from the calibration, so its predictions can be checked against
further executor runs. The executor has one pipeline and no tensor or data parallelism, so
t = d = 1, p = the ranks, and the microbatch holds the calibration's rows.
"""

from __future__ import annotations

import math

from sim.calibration import Calibration
from sim.sources import load_costs
from sim.costs import CostError

from .cluster import Cluster, Gpu, Link
from .config import Space
from .errors import PlanError
from .models import Transformer
from .search import PlanRequest


def runtime_gpt(model: dict) -> Transformer:
    """The executor's built-in gpt model (runtime/models.py: learned positions, pre-norm blocks
    with LayerNorm, biased linears, a 4h GELU FFN, an untied biased LM head, no dropout, fp32)."""
    try:
        hidden = int(model["hidden"])
        return Transformer("runtime-gpt", int(model["layers"]), hidden, int(model["heads"]), 4 * hidden,
                           int(model["vocab"]), int(model["seq_len"]), tied_embeddings=False, head_bias=True,
                           dropout=False, dtype_bytes=4)
    except KeyError as exc:
        raise PlanError(f"the calibration's model lacks {exc.args[0]!r}") from None


def load_calibration(path: str) -> Calibration:
    """A calibration file; PlanError if unreadable or if it is a plain cost model."""
    try:
        loaded = load_costs(path)
    except CostError as exc:
        raise PlanError(str(exc)) from None
    if not isinstance(loaded, Calibration):
        raise PlanError(f"{path} is a cost model, not a calibration (python -m sim calibrate RUN -o FILE makes one)")
    if loaded.model.get("model") != "gpt":
        raise PlanError(f"{path} calibrates the {loaded.model.get('model')!r} model; the planner plans transformers (gpt)")
    return loaded


def calibrated_request(calibration: Calibration, ranks: int, global_batch: int, space: Space, top: int = 10,
                       memory_cap: float | None = None) -> PlanRequest:
    """A request for the calibrated gpt model on `ranks` CPU ranks (module docstring)."""
    rows = calibration.rows
    if global_batch % rows:
        raise PlanError(f"the calibration's microbatch holds {rows} sequences; --global-batch {global_batch} "
                        f"is not a multiple of it")
    cpu = Gpu("cpu", math.nan, math.inf, math.nan)
    unlimited = Link(math.inf, 0.0)
    cluster = Cluster(cpu, 1, ranks, unlimited, unlimited, usable_memory=1.0)
    fixed = Space(tp=(1,), dp=(1,), pp=(ranks,), schedules=space.schedules, chunks=space.chunks,
                  microbatch_sizes=(rows,), zero=(0,), recompute=("none",), sequence_parallel=(False,))
    return PlanRequest(runtime_gpt(dict(calibration.model)), cluster, global_batch, fixed, top=top,
                       memory_cap=math.inf if memory_cap is None else memory_cap, calibration=calibration)
