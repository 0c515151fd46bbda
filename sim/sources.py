"""Where a simulation's costs come from: a cost model, a calibration, or a measured run itself.

A cost source (sim.costs.CostSource) answers one question, the cost model of a program
with n stages (`for_stages`): a `CostModel` is the same for every partition (scalars are
split over each rank's stages), a `Calibration` cuts its model into n stages. Both
describe themselves in one line (`describe`) for figure titles. A file given as
``--costs`` is either (told apart by the calibration's "format" key); the cost flags
(`CostOverrides`) change a cost model, never a calibration.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from schedules.io import read_json

from .calibration import Calibration, calibrate, is_calibration
from .costs import DEFAULT_ACTIVATION_MEMORY, CostError, CostModel, CostSource
from .coverage import Note
from .measured import MeasuredRun

# Used when neither a flag nor --costs gives a value: a transformer-like split, F = I = W = 1 s
# (B = I + W = 2 s). A transformer layer's backward costs about twice its forward, split about
# evenly between the input gradient and the weight gradient (each a GEMM of the forward's size;
# Qi et al., ICLR 2024, take T_F ~ T_B ~ T_W), so that the zero-bubble schedules, which move W
# into the bubbles, show what they are for with no flags given.
DEFAULT_COSTS = CostModel(forward=1.0, backward_input=1.0, backward_weight=1.0)


@dataclass(frozen=True)
class CostOverrides:
    """Values the cost flags set, each replacing the same value of a base cost model (None, or
    False for `no_contention`: not given). `backward` and `weight` are I and W (a full B is
    then I + W); `comm_bytes` is the bytes crossing every stage boundary both ways;
    `activation_bytes` one microbatch's activations through one rank's share (M_B), of which
    `weight_memory_fraction` stays from I until W (M_W / M_B)."""

    forward: float | None = None
    backward: float | None = None
    weight: float | None = None
    comm_latency: float | None = None
    comm_bandwidth: float | None = None
    comm_bytes: float | None = None
    no_contention: bool = False
    activation_bytes: float | None = None
    weight_memory_fraction: float | None = None

    def given(self) -> list[str]:
        """The flags given, as typed on the command line (e.g. ['--forward', '--no-contention'])."""
        return [f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None and getattr(self, f.name) is not False]

    def apply(self, base: CostModel) -> CostModel:
        """`base` with every given value replaced; CostError for a bad value."""
        changes: dict = {}
        if self.forward is not None:
            changes["forward"] = self.forward
        if self.backward is not None or self.weight is not None:
            # B = backward + weight; the one not given keeps the base's value (or the default).
            changes["backward_full"] = None
            for value, name in ((self.backward, "backward_input"), (self.weight, "backward_weight")):
                if value is None:
                    value = getattr(base, name)
                changes[name] = value if value is not None else getattr(DEFAULT_COSTS, name)
        for value, name in ((self.comm_latency, "p2p_latency"), (self.comm_bandwidth, "p2p_bandwidth"),
                            (self.comm_bytes, "p2p_activation_bytes")):
            if value is not None:
                changes[name] = value
        if self.comm_bytes is not None:
            changes["p2p_gradient_bytes"] = None
        if self.no_contention:
            changes["link_contention"] = False
        if self.activation_bytes is not None:
            changes["activation_memory"] = self.activation_bytes
        if self.weight_memory_fraction is not None:
            changes["weight_memory_fraction"] = self.weight_memory_fraction
            changes["weight_memory"] = None  # the fraction given replaces a file's bytes
        return dataclasses.replace(base, **changes) if changes else base


def _read(path: str | Path) -> tuple[dict, bool]:
    """A cost file's JSON document and whether it is a calibration."""
    data = read_json(path, CostError)
    return data, is_calibration(data)


def load_costs(path: str | Path) -> CostSource:
    """A cost model file or a calibration file (told apart by the calibration's format key)."""
    data, calibrated = _read(path)
    return Calibration.from_dict(data, str(path)) if calibrated else CostModel.from_dict(data)


def cost_source(path: str | Path | None, overrides: CostOverrides = CostOverrides()) -> CostSource:
    """The costs of ``--costs PATH`` and the cost flags: the file's (or the default) cost model
    with the overrides applied, or the calibration the file holds; CostError if flags would
    change a calibration (each schedule gets the cost model of its own stages from it)."""
    if path is None:
        return _bandwidth_used(overrides.apply(DEFAULT_COSTS), overrides)
    data, calibrated = _read(path)
    if not calibrated:
        return _bandwidth_used(overrides.apply(CostModel.from_dict(data)), overrides)
    given = overrides.given()
    if given:
        raise CostError(f"{path} is a calibration: its costs are not overridden by {', '.join(given)}")
    return Calibration.from_dict(data, str(path))


def real_activation_bytes(costs: CostSource) -> bool:
    """Whether activation bytes are sizes someone gave (a cost model's activation_memory other
    than the 1 GiB placeholder, or a calibration's measured bytes): only then are byte counts
    meaningful; otherwise only ratios to one microbatch's activations are."""
    return not isinstance(costs, CostModel) or costs.activation_memory != DEFAULT_ACTIVATION_MEMORY


def _bandwidth_used(model: CostModel, overrides: CostOverrides) -> CostModel:
    """`model`, or CostError when --comm-bandwidth was given but no byte crosses a stage boundary
    (a bandwidth then changes nothing: refused rather than silently ignored)."""
    if overrides.comm_bandwidth is None:
        return model
    sizes = [model.p2p_activation_bytes, model.p2p_gradient_bytes]
    if not any(isinstance(x, tuple) and any(x) or isinstance(x, (int, float)) and x for x in sizes):
        raise CostError("--comm-bandwidth has no effect: no bytes cross a stage boundary (give --comm-bytes)")
    return model


class RunCosts(NamedTuple):
    """What a measured run is simulated with (`costs_for_run`): the cost model, a phrase saying
    where it came from, the executor's loop gap per compute action its compute costs hold
    (a calibration's ``dispatch_overhead``; 0 for a cost model given as such) and what the run
    holds beyond the calibration's runs (sim.coverage; none for a cost model or a replay)."""

    costs: CostModel
    origin: str
    dispatch: float
    beyond: tuple[Note, ...] = ()  # what the run holds beyond a calibration's runs


def costs_for_run(path: str | Path | None, run: MeasuredRun) -> RunCosts:
    """The cost model to simulate a checked run's own program with (`RunCosts`): the cost model
    in `path`, the calibration in `path` cut to the run's stages, or (no path) a calibration
    from the run itself (its replay)."""
    if path is None:
        calibration = calibrate(run)
        return RunCosts(calibration.for_run(run), "calibrated from this run (replay)", calibration.dispatch_overhead)
    data, calibrated = _read(path)
    if not calibrated:
        return RunCosts(CostModel.from_dict(data), f"cost model {path}", 0.0)
    calibration = Calibration.from_dict(data, str(path))
    source = calibration.source
    origin = f"calibration {path} (from {source.get('schedule')} m={source.get('microbatches')}: {source.get('run')})"
    return RunCosts(calibration.for_run(run), origin, calibration.dispatch_overhead,
                    tuple(calibration.beyond(run.program, run.stage_layers)))


def run_costs(path: str | Path | None, overrides: CostOverrides, run: MeasuredRun) -> CostModel:
    """The cost model to replay a measured run with when cost flags may be given (`sim plot
    --run --overlay`): the flags' model if any flag is given (on `path`'s cost model or the
    default); else `costs_for_run` (the run is checked first)."""
    if overrides.given():
        return cost_source(path, overrides).for_stages(run.program.schedule.num_stages)
    return costs_for_run(path, run.checked()).costs
