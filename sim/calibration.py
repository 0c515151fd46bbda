"""Calibrating the simulator from one measured run, and the cost models it then predicts.

A `Calibration` is fitted from a run directory (sim.measured) and resolves to a
`CostModel` for any partition of the same model into stages (`for_stages`, the method
a CostModel answers too: sim.sources.CostSource), so that one run (say 1F1B at m=8)
predicts others (GPipe, interleaved, other m) without refitting.
Fitted parameters (seconds unless noted), each from the statistic named:

- **Compute per stage.** A stage's F (likewise B, I, W) costs
  ``fixed[role] + layers x per_layer``, its role (schedules.stages.Role) being ``first``
  (stage 0: the model's prologue such as an embedding, and no input gradient),
  ``middle``, ``last`` (the epilogue, e.g. norm and LM head, and the loss) or ``only``. ``fixed[middle]`` is the
  executor's fixed per-action cost (Python dispatch, hooks, the autograd engine's
  start); the other roles' fixed terms add what their extra modules cost. Per-layer
  costs cannot be told apart from fixed ones with the one layer count per role that a
  run has, so the shape comes from the run's per-layer profile (``profile.json`` of
  ``--profile-layers``: stage calls at 1, 2 and 4 layers): least squares over the
  profile's medians with one slope and one intercept per role. The profile runs
  outside the steps, so its level is then scaled to the run: ``speed_ratio`` =
  (sum over the run's stages of their measured cost) / (the same sum predicted from
  the profile), one ratio per kind. A stage's measured cost is that of a switching
  action at a later place (`compute_costs`, below): the mean over a step's actions and over
  the steps, since a step's length adds its actions' times up and a median would drop their
  tail (a median over steps replayed 81 calibration runs -2.2% short on average, the mean
  +0.6%; within 2% of themselves: 39 against 51).
  The fixed term of each role the run has is then set so that the run's own stages of
  that role cost what they measured (their mean; a stage's cost in the run depends on
  its rank's neighbours and load, not only on the profile's shape); the per-layer slope
  and the roles the run lacks keep the scaled profile.
  A forward whose backward is split (schedules.analysis.split_forwards) is its own kind,
  ``F_split`` (schedules.ir.SPLIT_FORWARD, sim.costs ``forward_split``): the executor runs
  its weight layers behind bridges that keep what W needs (runtime.split), which at 1-8 rows
  per microbatch made a ZB-H1 run's F 1.05-1.20x a 1F1B run's. A run that splits its
  backward measured its F as F_split (`table_kind`). The profile times both ways (F and B;
  F_split, I and W), so a run prices the kinds of the other way too: the profile's fit
  scaled by the speed ratio of their counterparts in the run (`COUNTERPARTS`: a 1F1B run's
  F_split by its F's ratio, I and W by its B's; a zero-bubble run's F by its F_split's, B by
  its I's and W's). A profile from before (one way timed) leaves those out: a 1F1B run then
  prices a split forward as F and splits B into I = W = B / 2 (sim.costs).
  Without a profile, the run's own per-stage costs are kept and only programs with
  the same stages can be simulated.
- **place_factors, switch_forward / switch_backward** (`compute_costs`): a stage's first
  actions of a kind in a step do other work than later ones (on the CPU executor the first
  backward assigns the weight gradients that later ones add to: x0.75-0.85 at mlp 64 rows;
  the second is dearer, x1.03-1.12, and the first forward after the optimizer x1.03-1.15),
  and an action whose rank's previous compute action had another stage or kind
  (schedules.analysis.switches) finds other data in the caches. Per kind, over cells of
  (stage, place class, switching), each valued at the mean over steps of its actions' step
  mean: value = c[stage] x f[place class] + switch x switching, f = 1 from place
  min(PLACES, m - 1) on; the switch from switching and repeating cells of the same stage and
  place where some hold both, then c and f by alternating least squares (`fit_cells`).
  Calibrating on the stages' switching cost alone, as before, left a 1F1B run at m = 2 9.5%
  short of itself: its rank 0 repeats B, so the only switching B was the cheap first one.
- **repeat_discount_forward / repeat_discount_backward** (`choose_discounts`): repeats keep
  getting cheaper over a long run; the k-th action of a run of its stage and kind costs its
  stage cost times 1 - discount x (1 - 1 / (k - 1)) from k = 3 on (sim.costs), so the cells
  above are (stage, place class, run length) and c[stage] x f[class] is times that factor. One
  discount per kind for all the runs calibrated together: the one under which `fit_cells` fits
  their cells best (weighted least squares; a grid over 0..0.9, refined by golden-section
  search), taken over the runs that can tell it, those with a stage holding repeats at two run
  lengths or more at one place class (GPipe's phases; at p=4 1F1B's warm-up F and cool-down B),
  each action valued as above or, where ranks shared cores, at its thread CPU time
  (`choose_discounts` says why); 0 where none can, which is the model without it.
- **compute_growth / growth_horizon** (`fit_growth`, where ranks shared cores and the runs
  have cpu.csv): a compute action costs its price times 1 + compute_growth x min(t,
  growth_horizon), t its start into the step (sim.costs.growth_factor). Where four ranks
  shared two cores, the same action's thread CPU time rose with how far into the step it ran
  (mlp 8 rows, sweep 18's calibration runs: 0.85 of its median 5-10 ms in, 1.19 at 40-50 ms),
  so a step of m = 4p priced it 8-15% dearer than one of m = p, in 1F1B and ZB-H1 alike (README,
  "Dearer the longer the step"); at p=2 on two cores the runs show no such rise with m, and the
  law is not fitted there. Fitted to the runs' switching actions at the later place class
  (priced alike per stage and kind), each group of one run, rank, stage and kind at its own
  level c and each step at its own level s (a step the machine ran slow holds dear actions and
  pushes them later: pooled, sweep 18's steps read 15/s where within steps say 4/s): thread CPU
  plus dispatch = c x s x (1 + rate x min(start, horizon)), by alternating least squares. The
  horizon is the latest start the runs hold (per run the median over steps of the step's latest
  compute start, then the largest): the law is held there, not extrapolated. Kept where the
  rate stands more than GROWTH_STANDARD_ERRORS standard errors from 0 (gpt 8 rows p=4, actions
  of 10-20 ms: 0.025/s, 2.3 standard errors, not kept). Every measured duration the cells,
  the discounts and the spreads read is taken over the factor at its start (`compute_frame`):
  the fitted prices are those at a step's start.
- **duration_spread**: how compute actions vary around their typical cost (a makespan is a
  max over paths, so the spread makes it longer than a replay of typical costs): each
  action's duration over its typical cost (mean over steps of its cell's step mean) times its
  rank's factor in that step (below), widened by sqrt(N / (N - 1)) for the N actions of the
  rank in the step, summarised as SPREAD_QUANTILES evenly spaced quantiles scaled to mean 1
  (the typical costs are means), which the simulator draws from (sim.costs; SPREAD_DRAWS
  replays, median draw).
- **step_spread, rank_spread**: slowness shared by all of a step's compute, and by a rank's
  compute in a step (a machine that computes slower for a while slows every rank at once, a
  rank that loses its core slows only its own actions; independent draws per action would
  average both out). A rank's factor in a step is the sum of its compute durations over the
  sum of their typical costs; the step's factor the same over all its ranks' compute; the
  rank's own factor is its factor over the step's, its deviation from 1 widened by
  sqrt(R / (R - 1)) for the R ranks the step's factor was taken over. Each as
  SPREAD_QUANTILES quantiles scaled to mean 1; the simulator gives every rank the same step
  factor per draw and each rank its own factor. On sweep 9's 1F1B calibration runs the
  ranks' factors in a step correlate (0.36 on average, 0.8 at gpt 8 rows p=2): drawn per
  rank alone, that shared part lengthened the slowest path of a draw more than the runs'.
- **transfer_spread**: the same for transfer times: each in-run transfer time (below)
  over the transfer law's at the loads it saw, as SPREAD_QUANTILES quantiles scaled to mean 1.
  On a loaded machine a transfer waits for the sending or receiving thread to get a core, and
  both ranks then wait in RECV far longer than the law says.
- **Executor overheads** (rank time that is neither compute nor waiting): every gap
  between the end of an action and the start of the next on its rank (a SEND's "end"
  is its start: its row runs until delivery) is fitted by least squares as a
  constant for the kind of action before the gap (compute: the loop's dispatch; SEND:
  posting the send, where gloo writes the payload into the socket; RECV) plus a cost
  per receive the executor posted in that gap (placed as runtime/executor.py places
  them: schedules.posting). Least squares fits means, not
  medians: a step's length adds these up, and their tails (a send that blocks for a
  millisecond) count. The costs cannot be negative, so the fit is constrained to
  non-negative ones (`nonnegative_least_squares`); clamping a negative one afterwards
  left the others where they had made up for it (a 1F1B run of 2 ms steps replayed
  +21%). ``dispatch_overhead`` is added to every compute action; ``send_overhead`` is
  the SEND constant; ``wake_overhead`` the constant of one more column, a SEND whose
  receiver had reached its RECV strictly before it (sim.transfers.TransferRow.woke, on the
  step's common clock) while the ranks computing at its start and the sender filled the cores
  they shared (runs whose ranks shared cores only): the sender then lost its core for a while
  (README, "A send that wakes its receiver"); ``recv_overhead`` is the RECV constant plus
  the posting cost plus the time to complete a receive whose data is already there (the
  mean RECV row of receives reached once the transfer law below had done their whole
  transfer; without any, the 10th percentile of RECV rows).
- **No send spread**: the gaps after a SEND spread widely where ranks share cores (on four
  ranks on two cores most cost 50-70 us, one in ten 0.5-1 ms); drawn per SEND like the transfer
  spread, their spread mended the calibration runs' own replays (mlp 8 rows p=4 interleaved
  -3.5% against -5.6%) but lengthened the held-out runs at m = p that were long already (the
  three-run MAPE of round 0 at mlp 8 and 64 rows and gpt 8 rows p=4 5.8 / 4.4 / 2.2% without
  it, 6.3 / 5.8 / 3.3% with it; README, "A send that wakes its receiver"), so it is not drawn.
- **p2p_latency / p2p_bandwidth / p2p_load_latency**: a transfer takes ``latency + bytes /
  bandwidth`` on an idle machine and ``p2p_load_latency`` more per rank computing while it is
  on the wire (sim.costs; the law and its fit: sim.transfers). In-run transfers: ``RECV end -
  SEND start`` of those whose receiver was already waiting when the send started, with the
  ranks that computed meanwhile, on one clock per step (rank clocks are aligned only at the
  step's barrier). The law's two parameters are fitted to them by least squares in seconds
  (means, for the same reason), together with the clocks where the load term is not 0;
  loads that do not vary, or a fit whose slope is not positive, give the mean transfer time
  and no load term. The load term is fitted only for a run whose ranks shared fewer cores
  than there were ranks (`shared_cores`), where a transfer's threads wait for a core that
  compute holds; elsewhere a transfer takes the mean in-run time, as before. At p=2 on two
  cores the fit found load terms of 0.45-1.5 ms per computing rank that did not carry to
  other schedules: held-out MAPE of the p=2 groups rose from 1.7-7.3% to 1.4-14.1% (three
  calibration runs) and up to 33% (pooled), predicting interleaved and V runs long by 30-50%
  (README, "Transfers that wait for a core"). Bandwidth comes from the ping-pong of ``--profile-p2p`` (least squares of
  one-way time on bytes) and the latency is the idle in-run time minus the bandwidth term;
  without a ping-pong, bandwidth is unlimited and the latency is the idle in-run time.
- **idle_share** (a run whose ranks shared fewer cores than there were ranks): the share of a
  core a rank takes while not computing (sim.costs), one of 0, 0.05, ..., 1, chosen by the
  runs' own step times (`calibrate_runs`, sim.share_choice): each candidate gets a calibration
  with every other parameter fitted under it (`calibrate_at_share`: every compute time of the
  runs taken under it, `compute_frame`) and the one that replays the runs' median step times
  best is kept. The cells' criterion it replaced (`fit_idle_share`, kept in the diagnostics:
  the share under which each cell's actions, stage, kind, switch and place, come out most
  alike on a core of their own) hardly tells shares apart where actions are noisy (sweep 11's
  p=4 three-run calibrations: 0.65-1 by the cells, 0-0.2 by the step times, whose held-out MAPE
  was 5.1 / 3.8 / 3.9% against 7.5 / 6.5 / 7.2%; bench/fidelity_sweeps.md, "Sweep 11", with
  sweep 12's replicate, where mlp 8 rows came out 6.0% against 4.9%). Processor sharing among compute alone (0)
  holds for long actions and not for short ones (bench/processor_sharing.py).
- **post_overhead**: rank time per receive posted before a rank's first action (sim.costs;
  with whole-step posting, every receive of its step): least squares of each rank's first
  row start in each step on its own clock (from its exit from the step's barrier; on a run
  with one clock, less the rank's step start there) on the receives it posted
  first (schedules.posting.posted_before), one slope and one intercept over all the runs
  calibrated together (`fit_post_overhead`). A run whose ranks all post as many (1F1B at
  p=2: m each) cannot tell the slope from the intercept; alone it fits 0, and the posting
  stays in step_overhead at that run's count. Sweep 9 (round 0 of each group, all its runs):
  26-35 us per receive at p=2, 37-50 us at p=4 (four ranks posting on two cores), the
  intercept 77-196 us.
- **step_overhead**: measured step time (barrier to barrier, rank 0) minus what the
  simulated makespan stands for (`step_spans`), mean over steps: on a run with one clock,
  from rank 0's first row less its simulated lead (post_overhead times the receives it posts
  first) to the latest row end (a compute row's end taken `dispatch_overhead` later as the
  simulator's row includes that gap), so that rank 0's time before its first row that posting
  does not explain is overhead, as on rank clocks; on rank clocks the span of the step's
  streams (earliest row start to latest row end, likewise) plus the simulated lead
  (post_overhead times the fewest receives a rank posts first, the time before the
  simulator's earliest row): the barriers, the optimizer and, before the first action, what
  posting does not explain. Ranks that leave the barrier later or earlier than rank 0 are
  not modelled (the simulator starts every rank at its posting). **step_overhead_spread**: each step's over
  that mean, as SPREAD_QUANTILES quantiles scaled to mean 1, drawn once per replay. The
  overhead has a right tail and hardly follows the span (correlation 0.09 over sweep 9's
  calibration runs), so the median step exceeds the median span plus the median overhead: by
  1.8% at mlp 2 rows and 1.4% at mlp 8 rows p=2 on those runs, which is what their
  self-replays missed on average; adding the overhead to each span independently leaves 0.7%
  and 0.2%.
- **Memory**: activation bytes per stage (F to B, the executor's saved-tensor meter),
  bytes kept from I to W (which may exceed them) and the input's and output's storages
  among them (sim.handover): ``fixed[role] + layers x per_layer`` from the profile's byte
  counts (exact; the profile counts the split ones for every run), else the run's
  per-stage values. Several runs take the split counts from a run whose profile has them.
- ``boundary_bytes``: bytes one microbatch sends across a stage boundary (the run's).
- **Gradient all-reduce** (a run with dp > 1 replicas, REDUCE_GRAD rows): a stage's
  reduction takes ``allreduce_latency + 2 (d-1)/d x bytes / allreduce_bandwidth`` (sim.costs),
  bytes its parameters' (summary.json's ``parameter_bytes``, per layer, so any cut of the
  model gets its own). Bandwidth from the all-reduce profile of ``--profile-p2p`` (least
  squares of its median times on 2 (d-1)/d x bytes), latency the mean in-run REDUCE_GRAD
  row (launch to completion, so it holds the wait for the slowest replica) minus the
  bandwidth term; without a profile, bandwidth is unlimited and the latency is the in-run
  mean. A prediction takes d from the run it predicts (`for_run`).

**Far-out steps** (`far_out_steps`): a step whose time lies beyond Tukey's far-out fence
(Q3 + 3 IQR of the run's step times; a run of four or more steps) is one the machine stalled,
and every fit above reads the run without it (`calibrate_runs`); the report names them and
the quality still replays the whole run. It fences off fewer than a quarter of the steps: with
more stalled, Q3 is itself a stalled step's time. On two shared cores 2-3 ms steps of a 1F1B run at
m=2 turned into 5-8 ms ones, 1-4 of 20, each holding one 3-4 ms gap on one rank (a posting
or dispatch gap, or a transfer: about a scheduler tick, a thread waiting for a core, we
suppose; not measured). The mean-fitted overheads and transfers took them in, and the
calibration replayed its own run up to +33% long (seven 20-step runs of 2026-12-06 that
spread at most 0.5); -0.7% to +5.1% with them left out and the constrained overhead fit
above. The fence moves only with far-out times: the 408 runs of sweeps 11 and 12 had 136
such steps among 10,176, in 110 runs. A run that stalls in half its steps has no typical
step to fit (its median lies between the two modes): its spread says so.

**Quality** (``quality``, filled by sim.quality.assess, which replays the calibration on
each run it was fitted on with the engine: the fit itself simulates nothing): per run, the
measured median step time, the simulated one, the signed self-replay error,
the run's step-time spread (interquartile range over the median) and its compute level (its
compute per step over the calibration's for its program, sim.comparison); `warnings` lists
every run whose error or spread exceeds sim.quality.QUALITY_LIMIT, and runs whose levels lie
further apart than it, so that a user can tell a model miss (error beyond the spread) from a
noisy machine (spread as large as the error, or runs at different levels).

**Several runs** (`calibrate_runs`, same model and microbatch size): each run is fitted
alone, then every scalar parameter is the mean over the runs, the spread's quantiles are
those of all runs' residuals together, and the quality is reported for each run. Compute
(`in_run_fits`), per kind (a kind from the runs that have it, so that a 1F1B run and a
zero-bubble run together give B as well as I and W): where the runs' own stages come in two
or more sizes (a 1F1B run with 4 layers per stage and an interleaved one with 2), least
squares over those stages' measured costs gives the slope and each role's fixed term from
the run alone. The profile's shape is not the run's: at mlp 64 rows on 2 cores, anchored
at 4 layers per stage it put a 2-layer stage's F at 0.77-0.99 ms where runs measured
1.02-1.16 (its slope too steep, its fixed term negative), and two-stage-per-rank
schedules were predicted 8-18% short. The split forward seen at one size (ZB-H1's) is F's in-run
fit times the ratio measured (`split_like_forward`). Another kind seen at one size (I and W from ZB-H1) takes its
profile slope times the mean ratio of in-run to profile slope of the kinds seen at two,
fixed terms putting its stages at their measured cost; roles no run holds keep the
profile's fixed term moved by the present roles' mean shift. With one size throughout, the
mean of the runs' anchored profile fits (a role's fixed term over the runs that have it).
The split runs' forwards are fitted as F_split, the others' as F (pooled, both were
mispriced: three-run self-replays at gpt 1 row, 1F1B +1.7..+3.5%, ZB-H1 -1.4..-3.9%); a kind
no run measured keeps the mean of the runs' profile fits. A switch cost is averaged over the
runs that tell it (`CellFit.told`): a ZB-H1 run's I all switch, and its 0 averaged in halved a
1F1B run's.

Predictions hold for the same model at the same microbatch size (rows per
microbatch); `check_run` refuses others.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from statistics import median
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np
import pandas as pd

from schedules import Program
from schedules.analysis import places, run_lengths, split_forwards, switches
from schedules.ir import COMPUTE_NAMES, RECV_NAMES, SEND_NAMES, SPLIT_FORWARD, Kind
from schedules.posting import posted_before, posted_first
from schedules.stages import ROLES, balanced_layers, role_of

from .costs import HANDOVER_MEMORY, CostError, CostModel, growth_factor, processor_share, repeat_factor
from .coverage import Coverage, Note, beyond, coverage_of
from .measured import MeasuredRun
from .share_choice import IDLE_SHARES, choose_share, replay_error
from .transfers import (TransferRow, early_receive_times, transfer_fit, transfer_residuals, transfer_rows,
                        transfer_time)

FORMAT = "bubblescope-calibration"
VERSION = 4
PLACES = 2  # a stage's first actions of a kind in a step that get their own factor
RECV_QUANTILE = 0.10
SPREAD_QUANTILES = 32
SPREAD_DRAWS = 256
BACKWARD_NAMES = ("B", "I", "W")  # kinds whose switch cost is switch_backward
# the kinds that tell switch_backward, in order: W's own switch (a ZB-H1 run's W after W) is not
# B's or I's (sweep 19, mlp 8 rows p=4, round 0: 182 us from ZB-H1's W, 26 us from 1F1B's B)
SWITCH_BACKWARD = ("B", "I")
GROWTH_STANDARD_ERRORS = 3.0  # how far from 0 a fitted growth must stand to be kept (fit_growth)
GROWTH_ITERATIONS = 100


@dataclass(frozen=True)
class LinearCost:
    """A per-stage quantity: ``fixed[role] + layers x per_layer`` (seconds, or bytes)."""

    per_layer: float
    fixed: Mapping[str, float]

    def at(self, role: str, layers: int) -> float:
        if role not in self.fixed:
            raise CostError(f"the calibration has no fit for {role} stages (its profile lacks them)")
        return self.fixed[role] + layers * self.per_layer

    def scaled(self, factor: float) -> "LinearCost":
        return LinearCost(self.per_layer * factor, {r: v * factor for r, v in self.fixed.items()})


@dataclass(frozen=True)
class Calibration:
    """What one run says about the machine and the model (fields: module docstring)."""

    source: Mapping[str, Any]
    model: Mapping[str, Any]
    rows: int
    num_layers: int
    boundary_bytes: int
    stages: tuple[Mapping[str, Any], ...]  # the run's own stages: layers, role, measured costs and bytes
    compute: Mapping[str, LinearCost] | None  # kind (SPLIT_FORWARD too) -> fit (None without a profile)
    activation: LinearCost | None
    weight_memory: LinearCost | None
    speed_ratio: Mapping[str, float]
    dispatch_overhead: float
    switch_forward: float
    switch_backward: float
    send_overhead: float
    recv_overhead: float
    step_overhead: float
    p2p_latency: float
    p2p_bandwidth: float = math.inf
    p2p_load_latency: float = 0.0
    duration_spread: tuple[float, ...] = ()
    transfer_spread: tuple[float, ...] = ()
    rank_spread: tuple[float, ...] = ()
    step_spread: tuple[float, ...] = ()
    step_overhead_spread: tuple[float, ...] = ()
    wake_overhead: float = 0.0  # more sender time per SEND that woke its receiver while the cores were full
    diagnostics: Mapping[str, Any] = field(default_factory=dict)
    quality: Mapping[str, Any] = field(default_factory=dict)
    data_parallel: int = 1
    allreduce_latency: float = 0.0
    allreduce_bandwidth: float = math.inf
    parameter_bytes: Mapping[str, Any] | None = None  # prologue, layers (list), epilogue
    place_factors: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # kind -> first places' factors
    idle_share: float = 0.0  # where the run's ranks shared cores (fit_idle_share)
    post_overhead: float = 0.0  # per receive posted before a rank's first action (fit_post_overhead)
    post_ahead: int | str = 0  # where the calibrated run posted its receives (summary.json's post_ahead)
    # sim.costs.HANDOVER_MEMORY name -> fit: the stages' input and output storages (sim.handover)
    handover_memory: Mapping[str, LinearCost] = field(default_factory=dict)
    # what a long run of repeats saves of the stage cost (sim.costs.repeat_factor)
    repeat_discount_forward: float = 0.0
    repeat_discount_backward: float = 0.0
    # a compute action's cost grows by this much per second into its step, up to the horizon
    # (sim.costs.growth_factor, `fit_growth`)
    compute_growth: float = 0.0
    growth_horizon: float = 0.0
    # what the runs held (sim.coverage.Coverage.to_dict; empty in a calibration written before it was kept)
    coverage: Mapping[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ prediction
    def for_stages(self, num_stages: int) -> CostModel:
        """The cost model of a program with `num_stages` stages holding the executor's
        balanced cut of the model's layers (schedules.stages.balanced_layers)."""
        return self.cost_model(num_stages)

    def cost_model(self, num_stages: int, stage_layers: Sequence[tuple[int, int]] | None = None) -> CostModel:
        """The cost model of a program with `num_stages` stages holding `stage_layers`
        (default: the executor's balanced cut of the model's layers)."""
        if stage_layers is None and self.num_layers < num_stages:
            raise CostError(f"the model has {self.num_layers} layers, fewer than the program's {num_stages} stages")
        layers = tuple(tuple(x) for x in stage_layers) if stage_layers is not None else balanced_layers(
            self.num_layers, num_stages)
        if len(layers) != num_stages:
            raise CostError(f"{len(layers)} layer ranges given for {num_stages} stages")
        counts = [b - a for a, b in layers]
        roles = [role_of(s, num_stages) for s in range(num_stages)]
        if self.compute is None:
            own = tuple(tuple(s["layers"]) for s in self.stages)
            if layers != own:
                raise CostError(
                    "this calibration has no per-layer profile (calibrate a run made with --profile-layers), "
                    f"so it only fits programs with the calibration run's stages {list(own)}"
                )
            times = {k: [s[k] for s in self.stages] for k in COMPUTE_NAMES if all(k in s for s in self.stages)}
            memory = [s["activation_bytes"] for s in self.stages]
            # A stage the run never split (DualPipeV splits some) has no measured bytes kept
            # for W: it keeps its activations, the zero-bubble paper's M_W = M_B.
            kept = ([s.get("weight_bytes", s["activation_bytes"]) for s in self.stages]
                    if any("weight_bytes" in s for s in self.stages) else None)
        else:
            times = {k: [fit.at(r, n) for r, n in zip(roles, counts)] for k, fit in self.compute.items()}
            memory = [self.activation.at(r, n) for r, n in zip(roles, counts)]
            kept = None if self.weight_memory is None else [self.weight_memory.at(r, n) for r, n in zip(roles, counts)]
        held = {}
        if self.compute is not None and self.handover_memory:
            at = {name: [max(round(fit.at(r, n)), 0) for r, n in zip(roles, counts)]
                  for name, fit in self.handover_memory.items()}
            # The storages are among the stage's activations, and what W keeps of them among
            # those: bounded so, should a fit over layer counts land a byte off.
            for side in ("input", "output"):
                whole = [min(x, max(round(a), 0)) for x, a in zip(at[f"{side}_memory"], memory)]
                held[f"{side}_memory"] = whole
                held[f"{side}_weight_memory"] = [min(k, w) for k, w in zip(at[f"{side}_weight_memory"], whole)]
        # Stage costs are switching actions' (what the run and the profile mostly hold); the
        # simulator's are repeating actions', with the switch cost added per action.
        times = {
            k: [max(t - (self.switch_backward if k in BACKWARD_NAMES else self.switch_forward), 0.0)
                + self.dispatch_overhead for t in v]
            for k, v in times.items()
        }
        backward = {}
        if "B" in times:
            backward["backward_full"] = times["B"]
        if "I" in times:
            backward["backward_input"] = times["I"]
            backward["backward_weight"] = times.get("W", [0.0] * num_stages)
        if not backward:
            raise CostError("the calibration has no backward costs (its run had neither B nor I actions)")
        return CostModel(
            data_parallel=self.data_parallel,
            grad_reduce_bytes=self.gradient_bytes(layers),
            allreduce_latency=self.allreduce_latency,
            allreduce_bandwidth=self.allreduce_bandwidth,
            # a split run's calibration from a profile of one way only knows its split forward
            forward=times.get("F", times.get(SPLIT_FORWARD)),
            forward_split=times.get(SPLIT_FORWARD),
            **backward,
            p2p_latency=self.p2p_latency,
            p2p_bandwidth=self.p2p_bandwidth,
            p2p_load_latency=self.p2p_load_latency,
            p2p_activation_bytes=self.boundary_bytes,
            activation_memory=[max(round(x), 0) for x in memory],
            weight_memory=None if kept is None else [max(round(k), 0) for k in kept],
            **held,
            send_overhead=self.send_overhead,
            wake_overhead=self.wake_overhead,
            recv_overhead=self.recv_overhead,
            step_overhead=self.step_overhead,
            post_overhead=self.post_overhead,
            post_ahead=self.post_ahead,
            switch_forward=self.switch_forward,
            switch_backward=self.switch_backward,
            repeat_discount_forward=self.repeat_discount_forward,
            repeat_discount_backward=self.repeat_discount_backward,
            compute_growth=self.compute_growth,
            growth_horizon=self.growth_horizon,
            place_factors={k: v for k, v in self.place_factors.items() if k in times},
            duration_spread=self.duration_spread,
            transfer_spread=self.transfer_spread,
            rank_spread=self.rank_spread,
            step_spread=self.step_spread,
            step_overhead_spread=self.step_overhead_spread,
            spread_draws=SPREAD_DRAWS,
        )

    def beyond(self, program: Program, stage_layers: Sequence[tuple[int, int]] | None = None) -> list[Note]:
        """What `program` (its stages holding `stage_layers`, default the balanced cut) holds beyond
        what the calibration's runs showed (sim.coverage)."""
        n = program.schedule.num_stages
        if stage_layers is None:
            stage_layers = balanced_layers(self.num_layers, n) if self.num_layers >= n else ()
        return beyond(Coverage.from_dict(self.coverage), program, [b - a for a, b in stage_layers])

    def for_run(self, run: MeasuredRun) -> CostModel:
        """The cost model of `run`'s program and layer ranges and data-parallel size (after `check_run`)."""
        self.check_run(run)
        costs = self.cost_model(run.program.schedule.num_stages, run.stage_layers)
        cores = shared_cores(run)
        return replace(costs, data_parallel=data_parallel_of(run), cores=cores,
                       idle_share=self.idle_share if cores is not None else 0.0, post_ahead=run.post_ahead.written)

    def gradient_bytes(self, layers: Sequence[tuple[int, int]]) -> list[int]:
        """Per stage holding `layers`, the bytes its REDUCE_GRAD all-reduces (0 if unknown)."""
        sizes = self.parameter_bytes
        if sizes is None:
            return [0] * len(layers)
        last = len(layers) - 1
        return [
            sum(sizes["layers"][a:b]) + (sizes["prologue"] if s == 0 else 0) + (sizes["epilogue"] if s == last else 0)
            for s, (a, b) in enumerate(layers)
        ]

    def describe(self) -> str:
        """One line naming where the costs come from, for figure titles."""
        source = self.source
        return (f"costs: calibrated on a {source.get('schedule')} m={source.get('microbatches')} run of "
                f"{self.model.get('model')} ({self.num_layers} layers, {self.rows} rows per microbatch)")

    def report(self) -> str:
        """A few lines naming every fitted parameter (what `sim calibrate` prints)."""
        def us(x: float) -> str:
            return f"{x * 1e6:.1f} us"

        src = self.source
        lines = [f"calibrated from {src['run']}: {src['schedule']} p={src['ranks']} m={src['microbatches']} "
                 f"v={src['chunks']}, {src['steps']} steps, model {dict(self.model)}, {self.rows} rows per microbatch"]
        if self.compute is None:
            lines.append("no profile.json with layers: per-stage costs of this run only (same stages only)")
            for st in self.stages:
                times = "  ".join(f"{k} {st[k] * 1e3:.3f} ms" for k in COMPUTE_NAMES if k in st)
                lines.append(f"  stage {st['stage']} ({st['role']}, layers {st['layers'][0]}..{st['layers'][1] - 1}): {times}")
        else:
            for kind, fit in self.compute.items():
                fixed = ", ".join(f"{role} {fit.fixed[role] * 1e3:+.3f}" for role in fit.fixed)
                ratio = self.speed_ratio.get(kind)
                lines.append(f"  {kind}: {fit.per_layer * 1e3:.3f} ms per layer; fixed per action (ms): {fixed}"
                             + (f"; run/profile speed ratio {ratio:.3f}" if ratio is not None else
                                " (timed by the profile only, at the speed ratio of its counterpart in the run)"))
        lines.append(f"  switch (action not repeating its rank's previous one): F +{us(self.switch_forward)}, "
                     f"B/I/W +{us(self.switch_backward)}")
        lines.append(f"  a long run of repeats saves (the k-th from k=3: x(1 - discount x (1 - 1/(k-1)))): "
                     f"F {100 * self.repeat_discount_forward:.1f}%, B/I/W {100 * self.repeat_discount_backward:.1f}%"
                     + ("" if self.repeat_discount_forward or self.repeat_discount_backward else
                        " (not told: no run here repeats a stage at two run lengths in one place class, as a "
                        "GPipe run at m = 2p does)"))
        told = self.diagnostics.get("compute_growth_fit")
        if self.compute_growth:
            lines.append(f"  compute grows into the step: x(1 + {self.compute_growth:.3g}/s x min(t, "
                         f"{self.growth_horizon * 1e3:.1f} ms)), from the thread CPU time of {told['actions']} actions "
                         f"(standard error {told['standard_error']:.2g}/s)" if told else
                         f"  compute grows into the step: x(1 + {self.compute_growth:.3g}/s x min(t, "
                         f"{self.growth_horizon * 1e3:.1f} ms))")
        elif told and told["rate"] is None:
            lines.append(f"  compute growth into the step not told: {told['actions']} actions, too few or all at one "
                         "start")
        elif told:
            lines.append(f"  compute growth into the step not kept: {told['rate']:.3g}/s over {told['actions']} "
                         f"actions, within {GROWTH_STANDARD_ERRORS:g} standard errors "
                         f"({told['standard_error']:.2g}/s) of none")
        if self.place_factors:
            places = "; ".join(f"{k} " + " ".join(f"x{x:.3f}" for x in v) for k, v in self.place_factors.items() if v)
            lines.append(f"  a stage's first actions of a kind in a step (cost over the later ones'): {places}")
        wake = (f" (+{us(self.wake_overhead)} where its receiver waits and the cores are full)"
                if self.wake_overhead else "")
        lines.append(f"  overheads: dispatch {us(self.dispatch_overhead)} per compute action, send {us(self.send_overhead)}"
                     f"{wake}, recv {us(self.recv_overhead)}, step {us(self.step_overhead)}")
        if self.post_overhead:
            lines.append(f"  receives posted before a rank's first action (post-ahead {self.post_ahead}): "
                         f"{us(self.post_overhead)} each")
        choice = self.diagnostics.get("idle_share_choice")
        if choice:  # sim.share_choice
            tried = ", ".join(f"{share} {100 * error:.1f}%" for share, error in choice["replay_error"].items())
            lines.append(f"  ranks sharing cores: a rank not computing takes {self.idle_share:.2f} of a core, chosen by "
                         f"the runs' step times (RMS replay error by share: {tried}; the cells' choice "
                         f"{choice['cells_share']:.2f})")
        elif self.idle_share:
            lines.append(f"  ranks sharing cores: a rank not computing takes {self.idle_share:.2f} of a core")
        held = Coverage.from_dict(self.coverage)
        if held.known:  # what predictions beyond it are told about (sim.coverage)
            repeats = ", ".join(f"{k} {n}" for k, n in sorted(held.longest_repeats.items()))
            lines.append(f"  the runs held: p = {', '.join(map(str, held.ranks))}; stages of "
                         f"{', '.join(map(str, held.stage_layers))} layers; longest runs of repeats {repeats}; "
                         + ("switches between stages on a rank" if held.stage_switches else "one stage per rank"))
        for path, steps in self.diagnostics.get("far_out_steps", {}).items():
            if steps:
                lines.append(f"  left out of every fit: {len(steps)} far-out step(s) of {path} (beyond Q3 + 3 IQR of its "
                             f"step times, a stalled machine): {', '.join(map(str, steps))}")
        bandwidth = "unlimited" if math.isinf(self.p2p_bandwidth) else f"{self.p2p_bandwidth / 1e9:.2f} GB/s"
        load = f", +{us(self.p2p_load_latency)} per rank computing meanwhile" if self.p2p_load_latency else ""
        lines.append(f"  p2p: latency {us(self.p2p_latency)}, bandwidth {bandwidth}, {self.boundary_bytes:,} bytes per "
                     f"boundary{load}")
        if self.duration_spread:
            q = np.quantile(self.duration_spread, [0.1, 0.5, 0.9])
            cv = float(np.std(self.duration_spread) / np.mean(self.duration_spread))
            lines.append(f"  compute time spread within a step: CV {cv:.2f}, 10/50/90th percentile x{q[0]:.2f} "
                         f"x{q[1]:.2f} x{q[2]:.2f} (replayed {SPREAD_DRAWS} times, median draw)")
        if self.rank_spread:
            q = np.quantile(self.rank_spread, [0.1, 0.5, 0.9])
            lines.append(f"  a rank's compute in a step: 10/50/90th percentile x{q[0]:.2f} x{q[1]:.2f} x{q[2]:.2f} "
                         "of its step's")
        if self.step_spread:
            q = np.quantile(self.step_spread, [0.1, 0.5, 0.9])
            lines.append(f"  all ranks' compute in a step: 10/50/90th percentile x{q[0]:.2f} x{q[1]:.2f} x{q[2]:.2f} "
                         "of its typical")
        if self.step_overhead_spread:
            q = np.quantile(self.step_overhead_spread, [0.1, 0.5, 0.9])
            lines.append(f"  step overhead spread: 10/50/90th percentile x{q[0]:.2f} x{q[1]:.2f} x{q[2]:.2f} of its mean")
        if self.transfer_spread:
            q = np.quantile(self.transfer_spread, [0.1, 0.5, 0.9])
            lines.append(f"  transfer time spread: 10/50/90th percentile x{q[0]:.2f} x{q[1]:.2f} x{q[2]:.2f} of the fit")
        lines += quality_lines(self.quality)
        if self.data_parallel > 1:
            bandwidth = "unlimited" if math.isinf(self.allreduce_bandwidth) else f"{self.allreduce_bandwidth / 1e9:.2f} GB/s"
            lines.append(f"  gradient all-reduce over dp={self.data_parallel}: latency {us(self.allreduce_latency)}, "
                         f"bandwidth {bandwidth}")
        return "\n".join(lines)

    def check_run(self, run: MeasuredRun) -> None:
        """Raise CostError unless `run` has this calibration's model and microbatch size."""
        theirs = {k: v for k, v in run.model.items() if k != "batch_size"}
        if theirs != dict(self.model):
            raise CostError(f"{run.path} runs model {theirs}, but the calibration is for {dict(self.model)}")
        if run.rows != self.rows:
            raise CostError(
                f"{run.path} has {run.rows} samples per microbatch, but the calibration was measured at {self.rows} "
                "(costs are per microbatch: keep the microbatch size and vary the batch size with m)"
            )

    # ------------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["p2p_bandwidth"] = None if math.isinf(self.p2p_bandwidth) else self.p2p_bandwidth
        data["allreduce_bandwidth"] = None if math.isinf(self.allreduce_bandwidth) else self.allreduce_bandwidth
        return {"format": FORMAT, "version": VERSION, **data}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "calibration") -> "Calibration":
        if not is_calibration(data):
            raise CostError(f"{where} is not a calibration (no \"format\": \"{FORMAT}\")")
        if data.get("version") != VERSION:
            raise CostError(f"{where} has calibration version {data.get('version')!r}; this reads version {VERSION}")
        values = {k: v for k, v in data.items() if k not in ("format", "version")}
        try:
            for key in ("p2p_bandwidth", "allreduce_bandwidth"):
                if values.get(key, None) is None:
                    values[key] = math.inf
            values["stages"] = tuple(values["stages"])
            values["duration_spread"] = tuple(values.get("duration_spread", ()))
            values["transfer_spread"] = tuple(values.get("transfer_spread", ()))
            values["rank_spread"] = tuple(values.get("rank_spread", ()))
            values["step_spread"] = tuple(values.get("step_spread", ()))
            values["step_overhead_spread"] = tuple(values.get("step_overhead_spread", ()))
            values["place_factors"] = {k: tuple(v) for k, v in values.get("place_factors", {}).items()}
            if values.get("compute") is not None:
                values["compute"] = {k: LinearCost(**v) for k, v in values["compute"].items()}
            for key in ("activation", "weight_memory"):
                if values.get(key) is not None:
                    values[key] = LinearCost(**values[key])
            values["handover_memory"] = {k: LinearCost(**v) for k, v in values.get("handover_memory", {}).items()}
            return cls(**values)
        except (TypeError, KeyError, AttributeError) as exc:
            raise CostError(f"{where} is malformed: {exc}") from None

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


def is_calibration(data: Any) -> bool:
    """Whether a JSON document is a calibration (rather than a cost model)."""
    return isinstance(data, Mapping) and data.get("format") == FORMAT


# ---------------------------------------------------------------------------- fitting
def calibrate(run: MeasuredRun) -> Calibration:
    """Fit every parameter of the module docstring from `run` (and its profile.json);
    sim.quality.assess adds how well it replays the run."""
    return calibrate_runs([run])


def calibrate_runs(runs: Sequence[MeasuredRun], idle_share: float | None = None) -> Calibration:
    """One calibration from several runs of the same model and microbatch size (module
    docstring); sim.quality.assess adds the quality of its replay of each. Where a run's ranks
    shared cores, `idle_share` fixes the share of a core a rank not computing takes; by default
    it is chosen by the runs' own step times (sim.share_choice), the choice and each candidate's
    replay error going to the diagnostics (``idle_share_choice``, beside the cells' choice,
    `fit_idle_share`). Elsewhere the share plays no part."""
    if not runs:
        raise CostError("calibrate needs at least one run")
    far = [far_out_steps(run) for run in runs]
    typical = [typical_steps(run) for run in runs]  # what every fit reads; the replays read the whole runs
    fits = [TransferFits.of(run) for run in typical]
    dispatch = [found.overheads.dispatch for found in fits]
    growth, told = fit_growth(typical, dispatch)  # one law for all
    discounts = choose_discounts(typical, dispatch, growth)  # one per kind for all
    noted = {"compute_growth_fit": told} if told else {}
    if any(far):
        noted["far_out_steps"] = {str(run.path): out for run, out in zip(runs, far)}
    if idle_share is not None or all(shared_cores(run) is None for run in runs):
        calibration = calibrate_at_share(typical, fits, 0.0 if idle_share is None else idle_share, discounts, growth)
    else:
        chosen, tried = choose_share(lambda share: calibrate_at_share(typical, fits, share, discounts, growth),
                                     lambda calibration: replay_error(calibration.for_run, runs))
        calibration = tried[chosen][1]
        noted["idle_share_choice"] = {"by": "step times", "share": chosen, "cells_share": fit_idle_share(*typical),
                                      "replay_error": {f"{s:.2f}": tried[s][0] for s in sorted(tried)}}
    held = coverage_of([run.program for run in runs], [[b - a for a, b in run.stage_layers] for run in runs])
    return replace(calibration, diagnostics={**calibration.diagnostics, **noted}, coverage=held.to_dict())


def far_out_steps(run: MeasuredRun) -> list[int]:
    """The run's steps whose time lies beyond Tukey's far-out fence, Q3 + 3 IQR of its step
    times: a step the machine stalled (module docstring, "Far-out steps")."""
    times = np.array(run.step_times)
    if len(times) < 4:  # quartiles of fewer steps fence nothing off
        return []
    q1, q3 = np.quantile(times, [0.25, 0.75])
    return [step for step, t in zip(run.steps, times) if t > q3 + 3 * (q3 - q1)]


def typical_steps(run: MeasuredRun) -> MeasuredRun:
    """The run without its far-out steps (`far_out_steps`): what every fit, and the compute
    level that sets a run beside its costs, reads."""
    out = far_out_steps(run)
    return run.with_steps([s for s in run.steps if s not in out]) if out else run


@dataclass(frozen=True)
class Growth:
    """How a compute action's cost grows into its step (sim.costs.growth_factor): `rate` per
    second, up to `horizon` seconds. The default is none."""

    rate: float = 0.0
    horizon: float = 0.0

    def factor(self, since_start):
        """sim.costs.growth_factor at `since_start` seconds (a number or a numpy array)."""
        return growth_factor(self.rate, self.horizon, since_start)

    def at_step_start(self, frame: pd.DataFrame, run: MeasuredRun) -> pd.DataFrame:
        """`frame` (rows of `run`'s timeline, by its index) with its durations over the factor at
        each row's start: what each would have cost at a step's start."""
        if not self.rate:
            return frame
        return frame.assign(duration=frame["duration"] / self.factor(run.timeline.loc[frame.index, "start"].to_numpy()))


def growth_rows(run: MeasuredRun, dispatch: float) -> pd.DataFrame | None:
    """The run's actions that tell the growth (`fit_growth`), or None where it tells none (its
    ranks had cores of their own, or it has no cpu.csv): its switching actions at the later
    place class, which the model prices alike per stage and kind (no place factor, no repeat
    discount), with their step, rank, stage, kind, start into the step and thread CPU time plus
    `dispatch` (the simulated action holds the loop's gap)."""
    if shared_cores(run) is None or run.cpu is None:
        return None
    frame = thread_cpu_rows(run)
    frame = frame[frame["switch"] & (frame["place"] == later_place(run))]
    return frame.assign(start=run.timeline.loc[frame.index, "start"], cost=frame["duration"] + dispatch)


def fit_growth(runs: Sequence[MeasuredRun], dispatch: Sequence[float]) -> tuple[Growth, dict[str, Any]]:
    """How a compute action's cost grows into its step, fitted to the thread CPU time of the
    runs' actions that tell it (`growth_rows`; `dispatch[i]` is run i's dispatch overhead), and
    what the fit found (empty where no run tells it). An action costs c x s x (1 + rate x
    min(start, horizon)): c its group's (run, rank, stage, kind), s its step's (run, step: a
    step the machine ran slow holds dear actions and pushes them later, which without s reads as
    growth), the horizon the latest start the runs hold (per run the median over its steps of
    the step's latest start, then the largest). Rate, c and s by alternating least squares
    (exact on costs that follow the law). Kept only where it stands out of its own noise (more
    than GROWTH_STANDARD_ERRORS standard errors from 0): elsewhere none (module docstring)."""
    pieces, horizon = [], 0.0
    for index, (run, gap) in enumerate(zip(runs, dispatch)):
        rows = growth_rows(run, gap)
        if rows is None or rows.empty:
            continue
        pieces.append(rows.assign(run=index))
        compute = run.timeline[run.timeline["kind"].isin(COMPUTE_NAMES)]
        horizon = max(horizon, float(compute.groupby("step")["start"].max().median()))
    if not pieces:
        return Growth(), {}
    rows = pd.concat(pieces, ignore_index=True)
    group = rows.groupby(["run", "rank", "stage", "kind"]).ngroup().to_numpy()
    step = rows.groupby(["run", "step"]).ngroup().to_numpy()
    in_group, in_step = np.bincount(group), np.bincount(step)
    cost, x = rows["cost"].to_numpy(), np.minimum(rows["start"].to_numpy(), horizon)
    told: dict[str, Any] = {"actions": int(len(rows)), "groups": int(len(in_group)), "steps": int(len(in_step)),
                            "horizon": horizon}
    free = len(rows) - len(in_group) - len(in_step) - 1
    if free <= 0 or np.ptp(x) <= 0:  # too few actions, or all at one start: nothing to tell
        return Growth(), {**told, "rate": None, "standard_error": None, "kept": False}
    rate, slow = 0.0, np.ones(len(in_step))
    for _ in range(GROWTH_ITERATIONS):
        grown = 1.0 + rate * x
        base = np.bincount(group, cost / (slow[step] * grown)) / in_group
        slow = np.bincount(step, cost / (base[group] * grown)) / in_step
        slow /= slow.mean()
        level = cost / (base[group] * slow[step])
        slope, intercept = np.polyfit(x, level, 1)
        new = float(slope / intercept)
        converged = abs(new - rate) <= 1e-12 * (1.0 + abs(new))
        rate = new
        if converged:
            break
    residual = level - (intercept + slope * x)
    error = math.sqrt(float(np.sum(residual ** 2)) / free / float(np.sum((x - x.mean()) ** 2))) / abs(float(intercept))
    kept = abs(rate) * horizon > 1e-9 and abs(rate) > GROWTH_STANDARD_ERRORS * error and 1.0 + rate * horizon > 0
    told = {**told, "rate": rate, "standard_error": error, "kept": bool(kept)}
    return (Growth(rate, horizon) if kept else Growth()), told


@dataclass(frozen=True)
class TransferFits:
    """What a run says that does not depend on the idle share (`calibrate_at_share`): its
    transfers on one clock per step (sim.transfers, the slow part of a fit), the transfer law
    fitted to them and the executor's overheads."""

    transfers: tuple[TransferRow, ...]
    law: tuple[float, float] | None  # (idle, load) of the transfer law, None if no receiver waited
    overheads: "ExecutorOverheads"

    @classmethod
    def of(cls, run: MeasuredRun) -> "TransferFits":
        # clock-aligned once: the overheads, latency and spread all read them; the load term
        # only where ranks share cores (module docstring)
        transfers = tuple(transfer_rows(run, loads=shared_cores(run) is not None))
        law = transfer_fit(transfers)
        return cls(transfers, law, executor_overheads(run, transfers, law))


def calibrate_at_share(runs: Sequence[MeasuredRun], fits: Sequence[TransferFits], idle: float,
                       discounts: Mapping[str, float], growth: "Growth | None" = None) -> Calibration:
    """`calibrate_runs`' fit of `runs` (already without their far-out steps: `far_out_steps`)
    with each run's share-independent fits given (`TransferFits.of`, in the order of `runs`;
    `discounts`: `choose_discounts` of them all; `growth`: `fit_growth` of them all, default none)
    and every run's compute taken under the idle share `idle`, so that a choice among shares fits
    the transfers, the discounts and the growth once."""
    growth = growth or Growth()
    if not runs:
        raise CostError("calibrate needs at least one run")
    post = fit_post_overhead(*runs)  # one slope for all: a single run often cannot show it
    fitted = [_fit_one(run, found, idle, post, discounts, growth) for run, found in zip(runs, fits)]
    first = fitted[0][0]
    for run, (c, _) in zip(runs[1:], fitted[1:]):
        if dict(c.model) != dict(first.model) or c.rows != first.rows:
            raise CostError(f"{run.path} runs model {dict(c.model)} at {c.rows} rows per microbatch, but "
                            f"{runs[0].path} runs {dict(first.model)} at {first.rows}: calibrate them separately")
        if (c.compute is None) != (first.compute is None):
            raise CostError(f"{run.path} and {runs[0].path}: either all runs have a profile.json or none")
    calibration = first if len(fitted) == 1 else _combine([c for c, _ in fitted], runs)
    pooled = [np.concatenate([r[j] for _, r in fitted]) for j in range(5)]
    calibration = replace(calibration, duration_spread=spread_quantiles(pooled[0]),
                          transfer_spread=spread_quantiles(pooled[1]), rank_spread=spread_quantiles(pooled[2]),
                          step_spread=spread_quantiles(pooled[3]), step_overhead_spread=spread_quantiles(pooled[4]),
                          idle_share=idle, post_overhead=post, compute_growth=growth.rate,
                          growth_horizon=growth.horizon)
    return calibration


def _combine(calibrations: list[Calibration], runs: Sequence[MeasuredRun]) -> Calibration:
    """The mean of several runs' calibrations (module docstring)."""
    def mean(values) -> float:
        return float(np.mean(list(values)))

    first = calibrations[0]
    compute = None
    if first.compute is not None:
        fits: dict[str, list[LinearCost]] = {}
        points: dict[str, list[tuple[str, int, float]]] = {}
        measured: dict[str, list[LinearCost]] = {}  # each kind's fits by the runs that measured it
        for c in calibrations:  # a 1F1B run gives F and B, a zero-bubble one F_split, I and W: keep all
            for kind, fit in c.compute.items():
                fits.setdefault(kind, []).append(fit)
            for kind in COMPUTE_NAMES:  # what the run itself measured, under its table's name
                key = table_kind(kind, bool(c.source.get("split_backward")))
                own = [(st["role"], st["layers"][1] - st["layers"][0], st[kind]) for st in c.stages if kind in st]
                points.setdefault(key, []).extend(own)
                if own and key in c.compute:
                    measured.setdefault(key, []).append(c.compute[key])
        # A kind some run measured is that run's (anchored at its stages), not averaged with the
        # profile-only estimates of the runs of the other way (sweep 20, mlp 8 rows: a 1F1B and a
        # ZB-H1 run together replayed the 1F1B run +8-10% with its F so averaged).
        fits.update(measured)
        profiled = {}
        for kind, found in fits.items():
            roles = sorted({r for f in found for r in f.fixed}, key=ROLES.index)
            profiled[kind] = LinearCost(mean(f.per_layer for f in found),
                                        {r: mean(f.fixed[r] for f in found if r in f.fixed) for r in roles})
        compute = in_run_fits({k: v for k, v in points.items() if v}, profiled)
    scalars = {name: mean(getattr(c, name) for c in calibrations) for name in (
        "dispatch_overhead", "send_overhead", "recv_overhead", "wake_overhead",
        "step_overhead", "p2p_latency", "p2p_load_latency", "repeat_discount_forward",
        "repeat_discount_backward")}
    for side in ("forward", "backward"):  # over the runs that tell it (all, where none does)
        told = [c for c in calibrations if c.diagnostics.get("switch_told", {}).get(side, True)]
        scalars[f"switch_{side}"] = mean(getattr(c, f"switch_{side}") for c in told or calibrations)
    inverse = [1.0 / c.p2p_bandwidth for c in calibrations]
    bandwidth = math.inf if not any(inverse) else 1.0 / mean(inverse)
    ratio = {k: mean(c.speed_ratio[k] for c in calibrations if k in c.speed_ratio)
             for k in (*COMPUTE_NAMES, SPLIT_FORWARD) if any(k in c.speed_ratio for c in calibrations)}
    places = {}
    for kind in COMPUTE_NAMES:
        fitted = [c.place_factors[kind] for c in calibrations if c.place_factors.get(kind)]
        if fitted:  # each place over the runs that have it (a run at small m has fewer)
            places[kind] = tuple(mean(f[q] for f in fitted if q < len(f)) for q in range(max(map(len, fitted))))
    # Bytes are the model's, not the machine's: any run's profile that measured what I keeps
    # for W (a split run's, or any run's since the profile measures it always) serves them all.
    kept = next((c.weight_memory for c in calibrations if c.weight_memory is not None), None)
    handover = next((c.handover_memory for c in calibrations if c.handover_memory), {})
    return replace(first, compute=compute, speed_ratio=ratio, p2p_bandwidth=bandwidth, place_factors=places,
                   weight_memory=kept, handover_memory=handover,
                   source={**first.source, "runs": [str(r.path) for r in runs]}, **scalars)


def quality_lines(quality: Mapping[str, Any]) -> list[str]:
    """The quality report's lines (what `sim calibrate` prints after the parameters)."""
    lines = []
    for entry in quality.get("runs", []):
        lines.append(f"  self-replay of {entry['run']} ({entry['schedule']}, {entry['steps']} steps): measured "
                     f"{entry['step_time_measured'] * 1e3:.2f} ms, simulated {entry['step_time_simulated'] * 1e3:.2f} "
                     f"ms, error {100 * entry['self_replay_error']:+.1f}%"
                     + (f" (the measured median's 95% interval {100 * entry['step_time_interval'][0]:+.1f}% to "
                        f"{100 * entry['step_time_interval'][1]:+.1f}%)" if entry.get("step_time_interval") else "")
                     + "; step-time spread (IQR / median) "
                     f"{100 * entry['step_time_spread']:.1f}%"
                     + (f" (simulated {100 * entry['step_time_spread_simulated']:.1f}%)"
                        if entry.get("step_time_spread_simulated") else "")
                     + (f"; compute at x{entry['compute_level']:.3f} of the fitted costs" if entry.get("compute_level") is not None
                        else "")
                     + ("; peak activation bytes exact on every rank" if entry.get("peak_activation_bytes_simulated")
                        == entry.get("peak_activation_bytes_measured", ()) else ""))
    lines += [f"warning: {w}" for w in quality.get("warnings", [])]
    return lines


def _fit_one(run: MeasuredRun, fits: TransferFits, idle: float, post: float = 0.0,
             discounts: Mapping[str, float] | None = None, growth: "Growth | None" = None
             ) -> tuple[Calibration, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Every parameter fitted from one run, and the run's compute, transfer, rank, step and
    step overhead spread residuals (no quality yet); where its ranks shared cores, its compute
    taken with a rank not computing taking `idle` of a core (`fit_idle_share`, over every run
    calibrated with it); `post` the cost of a receive posted before a rank's first action
    (`fit_post_overhead`), whose simulated lead leaves the step overhead; `discounts` what a long
    run of repeats saves, per kind (`choose_discounts`, over every run calibrated with it);
    `growth` how an action's cost grows into its step (`fit_growth`, likewise; default none)."""
    schedule = run.program.schedule
    growth = growth or Growth()
    transfers, law, (dispatch, send, recv, wake) = fits.transfers, fits.law, fits.overheads
    discounts = discounts or {}
    measured, switch, places = compute_costs(run, dispatch, idle, discounts, growth)
    split = any(any(split_forwards(stream)) for stream in run.program.streams)  # its F are split forwards
    stages = run_stages(run, measured)
    # which switch costs the run tells: a ZB-H1 run's I and W almost all switch, and a 0 for
    # "not told" averaged in with a 1F1B run's would halve its B's switch
    diagnostics: dict[str, Any] = {"switch_told": {"forward": "F" in switch,
                                                   "backward": any(k in switch for k in SWITCH_BACKWARD)}}
    compute = activation = weight_memory = None
    handover: dict[str, LinearCost] = {}
    ratio: dict[str, float] = {}
    layers_profile = (run.profile or {}).get("layers")
    if layers_profile is not None:
        if int(layers_profile["rows"]) != run.rows:
            raise CostError(f"{run.path}: profile.json was taken at {layers_profile['rows']} rows per microbatch, "
                            f"the run at {run.rows}")
        compute, ratio = fit_compute(layers_profile["records"], stages, diagnostics, split)
        activation, weight_memory, handover = fit_memory(layers_profile["records"])
    latency, bandwidth, load = fit_p2p(run, transfers, law, diagnostics)
    overheads = np.array(run.step_times) - np.array(step_spans(run, dispatch, post))
    step_overhead = max(float(np.mean(overheads)), 0.0) if len(overheads) else 0.0
    boundaries = run.boundary_bytes
    parameter_bytes = run.summary.get("parameter_bytes")
    allreduce_latency, allreduce_bandwidth = fit_allreduce(run, parameter_bytes, diagnostics)
    return Calibration(
        source={
            "run": str(run.path), "schedule": schedule.name, "ranks": schedule.ranks,
            "microbatches": schedule.microbatches, "chunks": schedule.chunks, "steps": len(run.steps),
            "split_backward": split,
            "step_time_median": run.step_time_median,
        },
        model={k: v for k, v in run.model.items() if k != "batch_size"},
        rows=run.rows,
        num_layers=int(run.model.get("layers", run.stage_layers[-1][1])),
        boundary_bytes=max(boundaries) if boundaries else 0,
        stages=tuple(stages),
        compute=compute,
        activation=activation,
        weight_memory=weight_memory,
        speed_ratio=ratio,
        dispatch_overhead=dispatch,
        switch_forward=switch.get("F", 0.0),
        switch_backward=next((switch[k] for k in SWITCH_BACKWARD if k in switch), 0.0),
        repeat_discount_forward=discounts.get("F", 0.0),
        repeat_discount_backward=discounts.get("B", discounts.get("I", 0.0)),
        send_overhead=send,
        wake_overhead=wake,
        recv_overhead=recv,
        step_overhead=step_overhead,
        p2p_latency=latency,
        p2p_bandwidth=bandwidth,
        p2p_load_latency=load,
        diagnostics=diagnostics,
        data_parallel=data_parallel_of(run),
        allreduce_latency=allreduce_latency,
        allreduce_bandwidth=allreduce_bandwidth,
        parameter_bytes=parameter_bytes,
        place_factors=places,
        idle_share=idle,
        post_ahead=run.post_ahead.written,
        handover_memory=handover,
    ), (spread_residuals(run, idle, growth), transfer_residuals(transfers, law), *rank_and_step_residuals(run, idle, growth),
        overheads / step_overhead if step_overhead > 0 else np.ones(0))


def shared_cores(run: MeasuredRun) -> int | None:
    """The cores the run's ranks shared (CostModel.cores), or None when each had its own as far
    as the run says: a CPU run on one host records them (summary.json's ``cpu_cores``,
    ``local_world_size``); GPU runs, runs across hosts and runs from before the field: None."""
    summary = run.summary
    cores, local = summary.get("cpu_cores"), summary.get("local_world_size")
    world = int((summary.get("layout") or {}).get("world_size", summary.get("ranks", 0)))
    if summary.get("device") != "cpu" or not cores or local != world or cores >= world:
        return None
    return int(cores)


def host_ranks(run: MeasuredRun) -> int:
    """The ranks on the run's host (summary.json's ``local_world_size``; every rank where it is
    not recorded): with `shared_cores`, the R of the idle share's law (sim.costs)."""
    return int(run.summary.get("local_world_size") or len(run.program.streams))


def full_speed(step: np.ndarray, start: np.ndarray, end: np.ndarray, cores: int, ranks: int = 0,
               idle: float = 0.0) -> np.ndarray:
    """Per compute row (its step, start, end), the time it would have taken on a processor of
    its own: the integral over its span of sim.costs.processor_share(k(t), cores, ranks, idle),
    k(t) the rows of its step running at t (on the run's one clock where it has one, else
    on rank clocks taken as aligned at the step start)."""
    out = np.zeros(len(start))
    for k_step in np.unique(step):
        here = step == k_step
        a, b = start[here], end[here]
        points = np.unique(np.concatenate([a, b]))
        # rows running in each segment [points[i], points[i + 1])
        running = np.searchsorted(np.sort(a), points[:-1], side="right") - np.searchsorted(np.sort(b), points[:-1],
                                                                                            side="right")
        rate = np.array([processor_share(k, cores, ranks, idle) for k in range(int(running.max()) + 1)])[running]
        integral = np.concatenate([[0.0], np.cumsum(np.diff(points) * rate)])
        out[here] = integral[np.searchsorted(points, b)] - integral[np.searchsorted(points, a)]
    return out


def first_posts(run: MeasuredRun) -> list[int]:
    """Per rank, the receives the executor posts before its first action (schedules.posting)."""
    return [posted_first(stream, run.post_ahead) for stream in run.program.streams]


def fit_post_overhead(*runs: MeasuredRun) -> float:
    """Rank time per receive posted before a rank's first action (module docstring): the slope
    of each (run, step, rank)'s first row start on the receives that rank posted first, one
    line over all `runs`; 0 where the counts do not vary or the slope is not positive."""
    counts, starts = [], []
    for run in runs:
        posts = first_posts(run)
        first = run.timeline.groupby(["step", "rank"])["start"].min()
        for (step, rank), start in first.items():
            if rank < len(posts):
                counts.append(posts[rank])
                starts.append(start - run.rank_start(step, rank))  # on the rank's own clock
    if len(set(counts)) < 2:
        return 0.0
    slope = float(np.polyfit(np.array(counts, dtype=float), np.array(starts), 1)[0])
    return max(slope, 0.0)


def fit_idle_share(*runs: MeasuredRun) -> float:
    """The share of a core a rank that is not computing takes (sim.costs, ``idle_share``) in
    runs whose ranks shared cores, 0 if none did: of IDLE_SHARES, the one under which the
    actions of each cell (run, stage, kind, switch, place) come out most alike on a processor of
    their own. Wrong shares make an action's own-core time depend on how many ranks computed
    beside it, which the cells' spread shows; the right one removes that dependence."""
    pieces = []  # per shared run: step, start, end, cell of each compute row, cores, ranks
    for run in runs:
        cores = shared_cores(run)
        if cores is None:
            continue
        frame = _compute_rows(run)
        rows = run.timeline.loc[frame.index]
        cells = frame.groupby(["stage", "kind", "switch", "place"]).ngroup().to_numpy()
        pieces.append((*(rows[c].to_numpy() for c in ("step", "start", "end")), cells, cores, host_ranks(run)))
    if not pieces:
        return 0.0
    best, least = 0.0, math.inf
    for share in IDLE_SHARES:
        spread = 0.0
        for step, start, end, cells, cores, ranks in pieces:
            own = np.log(np.maximum(full_speed(step, start, end, cores, ranks, share), 1e-12))
            means = np.bincount(cells, own) / np.bincount(cells)
            spread += float(np.sum((own - means[cells]) ** 2))
        if spread < least - 1e-12:
            best, least = share, spread
    return best


def data_parallel_of(run: MeasuredRun) -> int:
    """The run's data-parallel replicas (summary.json's layout; 1 for runs from before it)."""
    return int((run.summary.get("layout") or {}).get("dp", 1))


def fit_allreduce(run: MeasuredRun, parameter_bytes: Mapping[str, Any] | None,
                  diagnostics: dict) -> tuple[float, float]:
    """(latency, bandwidth) of the gradient all-reduce (module docstring); (0, inf) without one."""
    d = data_parallel_of(run)
    rows = run.timeline[run.timeline["kind"] == Kind.REDUCE_GRAD.value]
    if d < 2 or not len(rows):
        return 0.0, math.inf
    factor = 2 * (d - 1) / d
    bandwidth = math.inf
    profile = (run.profile or {}).get("allreduce")
    if profile is not None:
        sizes = sorted(int(k) for k in profile["seconds"])
        slope, base = np.polyfit([factor * k for k in sizes], [median(profile["seconds"][str(k)]) for k in sizes], 1)
        diagnostics["allreduce_profile_latency"] = max(float(base), 0.0)
        bandwidth = float(1.0 / slope) if slope > 0 else math.inf
    stage_bytes = [int(s.get("param_bytes") or 0) for s in run.summary["stage_costs"]]
    durations = (rows["end"] - rows["start"]).to_numpy()
    transfer = np.array([factor * stage_bytes[s] / bandwidth for s in rows["stage"]])
    diagnostics["in_run_allreduce_seconds"] = float(np.mean(durations))
    return max(float(np.mean(durations - transfer)), 0.0), bandwidth


def run_stages(run: MeasuredRun, measured: Mapping[str, list[float]]) -> list[dict[str, Any]]:
    """The run's stages: role, layer range, `measured` cost per kind (compute_costs), activation
    (and kept) bytes."""
    n = run.program.schedule.num_stages
    stages = []
    for s, (a, b) in enumerate(run.stage_layers):
        entry = run.summary["stage_costs"][s]
        stage = {"stage": s, "role": role_of(s, n).value, "layers": [a, b]}
        stage.update({k: values[s] for k, values in measured.items()})
        stage["activation_bytes"] = int(entry.get("activation_bytes") or 0)
        if entry.get("weight_grad_bytes") is not None:
            stage["weight_bytes"] = int(entry["weight_grad_bytes"])
        stages.append(stage)
    return stages


def table_kind(kind: str, split: bool) -> str:
    """The cost table's name for what a run measured as `kind`: a run that splits its backward
    (`split`) measured its F as the split forward (SPLIT_FORWARD)."""
    return SPLIT_FORWARD if split and kind == "F" else kind


# What the profile times that a run of the other way lacks, and the run's kinds whose speed
# ratio prices it: a 1F1B run's split forward, I and W; a zero-bubble run's plain forward and B.
COUNTERPARTS = {"F": (SPLIT_FORWARD,), SPLIT_FORWARD: ("F",), "I": ("B",), "W": ("B",), "B": ("I", "W")}


def fit_compute(records: list[dict], stages: list[dict], diagnostics: dict, split: bool = False
                ) -> tuple[dict, dict]:
    """Per kind the run measured: the profile's fixed + per-layer fit, scaled by the run's speed
    ratio and anchored at the run's stages (`table_kind`: a `split` run's F is the split
    forward); per kind only the profile timed (the other way's: `COUNTERPARTS`), its fit scaled by
    the mean speed ratio of its counterparts in the run."""
    compute, ratio = {}, {}
    timed = {k for r in records for k in (*COMPUTE_NAMES, SPLIT_FORWARD) if k in r}

    def profile_fit(key: str) -> LinearCost:
        fit, residual = fit_linear([(r["role"], r["layers"], median(r[key])) for r in records if key in r])
        diagnostics[f"profile_fit_rms_{key}"] = residual
        return fit

    for kind in (k for k in COMPUTE_NAMES if all(k in st for st in stages)):
        key = table_kind(kind, split)
        fit = profile_fit(key)
        predicted = sum(fit.at(st["role"], st["layers"][1] - st["layers"][0]) for st in stages)
        ratio[key] = sum(st[kind] for st in stages) / predicted if predicted > 0 else 1.0
        compute[key] = anchored(fit.scaled(ratio[key]), stages, kind)
        # How far the fitted model is from each of the run's own stages (relative).
        diagnostics[f"stage_error_{kind}"] = [
            compute[key].at(st["role"], st["layers"][1] - st["layers"][0]) / st[kind] - 1 for st in stages
        ]
    for key in sorted(timed - set(compute)):
        told = [ratio[k] for k in COUNTERPARTS[key] if k in ratio]
        if told:
            compute[key] = profile_fit(key).scaled(float(np.mean(told)))
    return compute, ratio


def anchored(fit: LinearCost, stages: list[dict], kind: str) -> LinearCost:
    """`fit` with each role the run has moved so that the run's stages of that role cost
    their measured mean (module docstring)."""
    fixed = dict(fit.fixed)
    for role in {st["role"] for st in stages}:
        own = [st for st in stages if st["role"] == role]
        miss = np.mean([st[kind] - fit.at(role, st["layers"][1] - st["layers"][0]) for st in own])
        fixed[role] = fit.fixed[role] + float(miss)
    return LinearCost(fit.per_layer, fixed)


def spread_residuals(run: MeasuredRun, idle: float | None = None, growth: "Growth | None" = None) -> np.ndarray:
    """Each compute action's duration over its typical cost (`typical_costs`) times its rank's
    factor in that step (what the step and rank spreads draw together,
    `rank_and_step_residuals`), its deviation widened by sqrt(n / (n - 1)) for a step and rank
    of n actions (the factor is fitted on them)."""
    frame = typical_costs(compute_frame(run, idle, growth))
    sums = frame.groupby(["step", "rank"])[["duration", "typical"]].transform("sum")
    size = frame.groupby(["step", "rank"])["duration"].transform("size")
    keep = (size >= 2) & (frame["typical"] > 0) & (sums["duration"] > 0)
    ratio = (frame["duration"] / frame["typical"] * sums["typical"] / sums["duration"])[keep].to_numpy()
    n = size[keep].to_numpy()
    return 1.0 + (ratio - 1.0) * np.sqrt(n / (n - 1.0))


def typical_costs(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` (compute_frame) with each action's typical duration: the mean over steps of
    the step's mean duration of its stage, kind, run length and place class (the cells of
    `compute_costs`: what the model tells apart is no spread)."""
    keys = ["stage", "kind", "length", "place"]
    typical = frame.groupby(keys + ["step"])["duration"].mean().groupby(level=[0, 1, 2, 3]).mean()
    return frame.join(typical.rename("typical"), on=keys)


def rank_and_step_residuals(run: MeasuredRun, idle: float | None = None,
                            growth: "Growth | None" = None) -> tuple[np.ndarray, np.ndarray]:
    """The rank spread's residuals (per step and rank: the rank's own factor) and the step
    spread's (per step: all ranks' compute over its typical cost), module docstring."""
    sums = typical_costs(compute_frame(run, idle, growth)).groupby(["step", "rank"])[["duration", "typical"]].sum()
    sums = sums[sums["typical"] > 0]
    steps = sums.groupby(level="step").sum()
    shared = steps["duration"] / steps["typical"]
    own = (sums["duration"] / sums["typical"]) / shared.reindex(sums.index.get_level_values("step")).to_numpy()
    ranks = sums.groupby(level="step").size().reindex(sums.index.get_level_values("step")).to_numpy()
    keep = ranks >= 2  # a step of one rank: its factor is the step's
    widened = 1.0 + (own.to_numpy()[keep] - 1.0) * np.sqrt(ranks[keep] / (ranks[keep] - 1.0))
    return widened, shared.to_numpy()


def spread_quantiles(residuals: np.ndarray) -> tuple[float, ...]:
    """SPREAD_QUANTILES evenly spaced quantiles of the residuals, at least 0; none when there are
    no residuals or every one is 1 (no spread: the replay needs no draws)."""
    if not len(residuals) or np.allclose(residuals, 1.0, rtol=0, atol=1e-9):
        return ()
    levels = (np.arange(SPREAD_QUANTILES) + 0.5) / SPREAD_QUANTILES
    quantiles = np.maximum(np.quantile(residuals, levels), 0.0)
    # Typical costs are means, so the factors keep mean 1: evenly spaced quantiles leave out
    # the far tail and would otherwise make a draw faster on average than the run.
    return tuple(float(x) for x in quantiles / quantiles.mean())


def fit_memory(records: list[dict]) -> tuple[LinearCost, LinearCost | None, dict[str, LinearCost]]:
    """Per stage from the profile's byte counts: activation bytes, bytes kept from I to W, and
    the input's and output's storages among them (sim.handover; by HANDOVER_MEMORY name); a
    profile made before a count was recorded leaves it out (None, {})."""
    def fit(key: str) -> LinearCost | None:
        if not all(key in r for r in records):
            return None
        return fit_linear([(r["role"], r["layers"], r[key]) for r in records])[0]

    handover = {name: fit(name.replace("memory", "bytes")) for name in HANDOVER_MEMORY}
    return fit("activation_bytes"), fit("weight_bytes"), handover if all(handover.values()) else {}


class ExecutorOverheads(NamedTuple):
    """The executor's rank time per action (seconds; `executor_overheads`)."""

    dispatch: float  # per compute action
    send: float  # per SEND
    recv: float  # least time of a RECV
    wake: float  # more per SEND that woke its receiver while the cores were full


def executor_overheads(run: MeasuredRun, transfers: Sequence[TransferRow],
                       law: tuple[float, float] | None) -> ExecutorOverheads:
    """Rank time per action (module docstring): least squares of every gap between consecutive
    actions of a rank on one constant per kind of the action before the gap (compute, SEND,
    RECV), one more for a SEND whose receiver had reached its RECV before it (`transfers`'
    TransferRow.woke) while the ranks computing and the sender filled the cores they shared
    (none where they did not share them) and a cost per receive posted in the gap; receives
    whose data was there by the transfer `law` (`transfer_fit`) give the cost of a RECV."""
    posts = [posted_before(stream, run.post_ahead) for stream in run.program.streams]
    kinds = [[_gap_kind(a) for a in stream] for stream in run.program.streams]
    cores = shared_cores(run)
    woke = {(t.step, t.sending) for t in transfers if t.woke_on_full(cores)}
    rows, gaps = [], []
    for (step, rank), frame in run.timeline.groupby(["step", "rank"], sort=True):
        start = frame["start"].to_numpy()
        actions = frame["action"].to_numpy()
        # A SEND's row runs until delivery, a REDUCE_GRAD's until its all-reduce is done: the
        # rank moved on at their start.
        end = np.where(frame["kind"].isin((*SEND_NAMES, Kind.REDUCE_GRAD.value)), start, frame["end"].to_numpy())
        for i in range(len(start) - 1):
            # Receives posted before a compute action that follows its RECV run inside the RECV's
            # row (the executor stamps a RECV's end when the compute waits on it, after posting).
            posted = posts[rank][i + 1] if kinds[rank][i] != _AFTER_RECV else 0
            row = [0.0, 0.0, 0.0, float(posted), float((int(step), actions[i]) in woke)]
            row[kinds[rank][i]] = 1.0
            rows.append(row)
            gaps.append(start[i + 1] - end[i])
    if not gaps:
        return ExecutorOverheads(0.0, 0.0, 0.0, 0.0)
    coef = nonnegative_least_squares(np.array(rows), np.array(gaps))
    after_compute, after_send, after_recv, post, wake = (float(x) for x in coef)
    recvs = run.timeline[run.timeline["kind"].isin(RECV_NAMES)]
    if not len(recvs):
        return ExecutorOverheads(after_compute, after_send, 0.0, wake)
    early = early_receive_times(transfers, law) if law is not None else []
    least = float(np.mean(early)) if early else float(np.quantile(recvs["end"] - recvs["start"], RECV_QUANTILE))
    return ExecutorOverheads(after_compute, after_send, post + least + after_recv, wake)


_AFTER_COMPUTE, _AFTER_SEND, _AFTER_RECV = 0, 1, 2  # columns of the gap fit


def nonnegative_least_squares(design: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Least squares of `target` on `design`'s columns with every coefficient >= 0: the best
    unconstrained fit over each subset of columns whose coefficients all come out >= 0 (exact
    for the few columns of a gap fit). Clamping an unconstrained fit's negative coefficient
    to 0 instead leaves the others where they compensated for it: with two 2 ms steps of a
    1F1B run a -27 us dispatch cost came with a 267 us cost per posted receive (52 us where
    the dispatch came out positive), and the clamped pair replayed the run +21% long."""
    best, best_residual = np.zeros(design.shape[1]), float(np.sum(target ** 2))
    for size in range(1, design.shape[1] + 1):
        for columns in itertools.combinations(range(design.shape[1]), size):
            part = design[:, columns]
            if not part.any(axis=0).all():  # a column no row has stays 0
                continue
            coef = np.linalg.lstsq(part, target, rcond=None)[0]
            residual = float(np.sum((part @ coef - target) ** 2))
            if (coef >= 0).all() and residual < best_residual:
                best, best_residual = np.zeros(design.shape[1]), residual
                best[list(columns)] = coef
    return best


def _gap_kind(action) -> int:
    """The column of the gap fit for the gap after `action`."""
    kind = action.kind
    return _AFTER_COMPUTE if kind.is_compute else _AFTER_SEND if kind.is_send or kind.is_collective else _AFTER_RECV


def fit_p2p(run: MeasuredRun, transfers: Sequence[TransferRow], law: tuple[float, float] | None,
            diagnostics: dict) -> tuple[float, float, float]:
    """(latency, bandwidth, load latency): in-run transfer time on an idle machine and per rank
    computing meanwhile (`law`, from `transfer_fit`), the former split by the ping-pong's
    bandwidth when there is one."""
    diagnostics["in_run_transfer_seconds"] = transfer_time(transfers)
    idle, load = (None, 0.0) if law is None else law
    p2p = (run.profile or {}).get("p2p")
    if p2p is None:
        return (idle if idle is not None else 0.0), math.inf, load
    base, bandwidth = fit_bandwidth(p2p["one_way_seconds"])
    diagnostics["pingpong_latency"] = base
    if idle is None:
        return base, bandwidth, 0.0
    boundary = run.boundary_bytes[0] if run.boundary_bytes else 0
    return max(idle - boundary / bandwidth, 0.0), bandwidth, load


def compute_costs(run: MeasuredRun, dispatch: float, idle: float | None = None,
                  discounts: Mapping[str, float] | None = None, growth: "Growth | None" = None
                  ) -> tuple[dict[str, list[float]], dict[str, float], dict[str, tuple[float, ...]]]:
    """Per compute kind present: each stage's cost of a switching action at a later place,
    what switching adds (kinds whose cells tell it: `CellFit.told`), and the factors of a stage's first places in a step (module docstring),
    under `discounts` (kind -> what a long run of repeats saves, default none: sim.costs,
    `choose_discounts`).

    Cells are (stage, place class, run length): the place class is the action's place
    (schedules.analysis.places) up to `later_place` (at m = 1 there are no factors), the run
    length schedules.analysis.run_lengths. A cell's value is the mean over
    steps of its actions' mean duration in the step (a step's length adds them up, and the
    spreads below are scaled to mean 1 around these), plus `dispatch` (the simulated action
    holds the loop's gap, which the measured row leaves out), over `growth`'s factor at the
    action's start (the price at a step's start, default no growth). The model value = c[stage] x
    f[class] x repeat_factor(length) + switch x [length = 1], f = 1 for later actions, is fitted
    by `fit_cells`.
    """
    costs, extra, factors = {}, {}, {}
    n = run.program.schedule.num_stages
    top = later_place(run)
    frame = compute_frame(run, idle, growth, dispatch)
    for kind, cells in kind_cells(frame).items():
        fit = fit_cells(cells, top, (discounts or {}).get(kind, 0.0))
        costs[kind] = [fit.stage_cost[st] + fit.switch - dispatch if st in fit.stage_cost else 0.0 for st in range(n)]
        if fit.told:
            extra[kind] = fit.switch
        if top > 0:
            factors[kind] = fit.factors[:top]
    return costs, extra, factors


def kind_cells(frame: pd.DataFrame) -> dict[str, "Cells"]:
    """Per compute kind `frame` (compute_frame's columns, each action's value its duration)
    holds, its cells (`compute_costs`)."""
    out = {}
    for kind in COMPUTE_NAMES:
        rows = frame[frame["kind"] == kind]
        if not len(rows):
            continue
        per_step = rows.groupby(["stage", "place", "length", "step"])["duration"].agg(["mean", "size"])
        cells = per_step.groupby(level=[0, 1, 2]).agg(value=("mean", "mean"), weight=("size", "median"))
        out[kind] = Cells(cells.index.get_level_values(0).to_numpy(), cells.index.get_level_values(1).to_numpy(),
                          cells.index.get_level_values(2).to_numpy().astype(int), cells["value"].to_numpy(),
                          cells["weight"].to_numpy())
    return out


@dataclass(frozen=True)
class Cells:
    """One kind's cells (`compute_costs`), one entry per (stage, place class, run length)."""
    stage: np.ndarray
    place: np.ndarray
    length: np.ndarray  # schedules.analysis.run_lengths: 1 switches
    value: np.ndarray
    weight: np.ndarray  # actions per step in the cell

    def tells_discount(self) -> bool:
        """Whether the cells can tell what a long run of repeats saves: some stage and place class
        hold repeats at two or more run lengths (a GPipe phase; at p = 2 a 1F1B, ZB-H1 or
        interleaved run at m = 2p holds runs of 2 at most)."""
        repeats = self.length >= 2
        pairs = set(zip(self.stage[repeats].tolist(), self.place[repeats].tolist(), self.length[repeats].tolist()))
        groups = [(st, q) for st, q, _ in pairs]
        return len(groups) > len(set(groups))

    def residual(self, fit: "CellFit", discount: float) -> float:
        """Weighted sum of squared differences between the cells' values and `fit` under `discount`."""
        repeat = np.array([repeat_factor(discount, k) for k in self.length.tolist()])
        model = np.array([fit.stage_cost[st] for st in self.stage.tolist()]) * np.asarray(fit.factors)[self.place] \
            * repeat + fit.switch * (self.length == 1)
        return float(np.sum(self.weight * (self.value - model) ** 2))


@dataclass(frozen=True)
class CellFit:
    """`fit_cells`' answer for one kind."""
    stage_cost: dict[int, float]  # c[stage]: a repeating action's cost at a later place, second in its run
    switch: float
    factors: tuple[float, ...]  # f[place class], the last (later places) 1
    told: bool = True  # whether the cells told the switch (some stage holds switching and repeating actions)


def fit_cells(cells: Cells, top: int, discount: float = 0.0) -> CellFit:
    """value = c[stage] x f[place] x r(length) + switch x [length = 1], f = 1 for later places,
    r = sim.costs.repeat_factor at `discount` (1 up to the second of a run), switch >= 0.

    Where a stage and place class hold both switching and repeating actions, the switch is
    their difference (each repeating cell taken back to r = 1; weighted mean over such pairs),
    fixed before c and f are fitted. Fitted
    jointly with them instead, it acted as a constant added to almost every cell (in a ZB-H1
    run all W but one switch), which c x f then offset: c went negative, f to x8 and x0.08,
    and the run replayed 57% long. Where no such pair exists (1F1B's F: only stage 0's
    second F repeats), the switch is fitted jointly, identified through f being shared by
    the stages, and only where some stage holds both. Alternating least squares, weighted by
    the cell's actions per step (each step's length adds them up): (c, switch) given f, then
    each f given c.
    """
    repeat = np.array([repeat_factor(discount, k) for k in cells.length.tolist()])
    switching = cells.length == 1
    differences, weights = [], []
    for st, q in sorted(set(zip(cells.stage.tolist(), cells.place.tolist()))):
        here = (cells.stage == st) & (cells.place == q)
        on, off = here & switching, here & ~switching
        if on.any() and off.any():
            back = np.average(cells.value[off] / repeat[off], weights=cells.weight[off])
            differences.append(float(cells.value[on][0] - back))
            weights.append(float(cells.weight[on][0] + cells.weight[off].sum()))
    direct = max(float(np.average(differences, weights=weights)), 0.0) if differences else None
    stages = np.unique(cells.stage)
    joint = direct is None and any(len(np.unique(switching[cells.stage == st])) == 2 for st in stages)
    flag = switching.astype(float)
    root = np.sqrt(cells.weight)
    f = np.ones(top + 1)
    switch = direct or 0.0
    for _ in range(50):
        design = np.zeros((len(cells.value), len(stages) + 1))
        design[np.arange(len(cells.value)), np.searchsorted(stages, cells.stage)] = f[cells.place] * repeat
        design[:, -1] = flag
        columns = list(range(len(stages))) + ([len(stages)] if joint else [])
        target = cells.value - (0.0 if joint else switch) * flag
        coef = np.linalg.lstsq(design[:, columns] * root[:, None], target * root, rcond=None)[0]
        if joint and coef[-1] < 0:  # switching cannot be cheaper: refit without it
            columns = columns[:-1]
            target = cells.value
            coef = np.linalg.lstsq(design[:, columns] * root[:, None], target * root, rcond=None)[0]
        c = coef[:len(stages)]
        if joint:
            switch = float(coef[-1]) if len(columns) > len(stages) else 0.0
        before = f.copy()
        y = cells.value - switch * flag
        scale = c[np.searchsorted(stages, cells.stage)] * repeat
        for q in range(top):
            here = cells.place == q
            denominator = np.sum(cells.weight[here] * scale[here] ** 2)
            if here.any() and denominator > 0:
                f[q] = max(float(np.sum(cells.weight[here] * y[here] * scale[here]) / denominator), 0.0)
        if np.max(np.abs(f - before)) < 1e-12:
            break
    return CellFit({int(st): float(x) for st, x in zip(stages, c)}, switch, tuple(float(x) for x in f),
                   direct is not None or joint)


DISCOUNT_GRID = tuple(x / 20 for x in range(19))  # 0, 0.05, ..., 0.9; then refined between neighbours
DISCOUNT_REFINE = 24  # golden-section steps: the bracket shrinks to 0.1 x 0.618^24, about 1e-6


def choose_discounts(runs: Sequence[MeasuredRun], dispatch: Sequence[float],
                     growth: "Growth | None" = None) -> dict[str, float]:
    """Per compute kind: what a long run of repeats saves (sim.costs.repeat_factor) that fits the
    cells of `runs` best (least squares over the runs that can tell it, `Cells.tells_discount`,
    each run fitted by `fit_cells` at that discount); 0 where none can. `dispatch[i]` is run i's
    dispatch overhead. A grid, then golden-section search between the best point's neighbours.

    A run whose ranks shared cores (`shared_cores`) tells it by its actions' thread CPU time
    (cpu.csv), or not at all without one: its repeats come in warm-up and cool-down, where fewer
    ranks compute, and their durations on a core of their own, read through the sharing model,
    carry that model's miss there, of the discount's size. So the choice does not depend on the
    idle share: made once for every share `calibrate_runs` tries. Each value is taken over
    `growth`'s factor at its action's start (`fit_growth`; default none), as the cells are.
    """
    told: dict[str, list[tuple[Cells, int]]] = {}
    for run, gap in zip(runs, dispatch):
        shared = shared_cores(run) is not None
        if shared and run.cpu is None:
            continue
        # a core per rank: as measured; else the thread CPU time, which a wait for a core does not count
        frame = thread_cpu_rows(run) if shared else _compute_rows(run)
        frame["duration"] += gap
        frame = (growth or Growth()).at_step_start(frame, run)
        top = later_place(run)
        for kind, cells in kind_cells(frame).items():
            if cells.tells_discount():
                told.setdefault(kind, []).append((cells, top))
    out = {}
    for kind, sets in told.items():
        def loss(discount: float) -> float:
            return sum(cells.residual(fit_cells(cells, top, discount), discount) for cells, top in sets)

        grid = [loss(x) for x in DISCOUNT_GRID]
        best = int(np.argmin(grid))
        low, high = DISCOUNT_GRID[max(best - 1, 0)], DISCOUNT_GRID[min(best + 1, len(DISCOUNT_GRID) - 1)]
        ratio = (math.sqrt(5) - 1) / 2
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        la, lb = loss(a), loss(b)
        for _ in range(DISCOUNT_REFINE):
            if la <= lb:
                high, b, lb = b, a, la
                a = high - ratio * (high - low)
                la = loss(a)
            else:
                low, a, la = a, b, lb
                b = low + ratio * (high - low)
                lb = loss(b)
        refined = (a, la) if la <= lb else (b, lb)
        out[kind] = refined[0] if refined[1] < grid[best] else DISCOUNT_GRID[best]
    return out


def later_place(run: MeasuredRun) -> int:
    """The place class of a stage's later actions in the run: min(PLACES, m - 1), so that every
    stage keeps at least one action in it (places below it get factors)."""
    return min(PLACES, run.program.schedule.microbatches - 1)


def _compute_rows(run: MeasuredRun) -> pd.DataFrame:
    """The run's compute rows as measured (compute_frame's columns, wall durations)."""
    timeline = run.timeline
    top = later_place(run)
    flags = [switches(stream) for stream in run.program.streams]
    lengths = [run_lengths(stream) for stream in run.program.streams]
    order = [places(stream) for stream in run.program.streams]
    position = timeline.groupby(["step", "rank"]).cumcount().to_numpy()
    ranks = timeline["rank"].to_numpy()
    frame = pd.DataFrame({
        "step": timeline["step"], "rank": timeline["rank"], "stage": timeline["stage"], "kind": timeline["kind"],
        "switch": [flags[r][i] for r, i in zip(ranks, position)],
        "length": [lengths[r][i] for r, i in zip(ranks, position)],
        "place": [min(order[r][i], top) for r, i in zip(ranks, position)],
        "duration": timeline["end"] - timeline["start"],
    })
    return frame[timeline["kind"].isin(COMPUTE_NAMES)].copy()


def thread_cpu_rows(run: MeasuredRun) -> pd.DataFrame:
    """The run's compute rows (`_compute_rows`' columns) that cpu.csv holds, each duration its
    thread CPU seconds."""
    seconds = run.thread_cpu
    frame = _compute_rows(run)
    return frame.loc[frame.index.intersection(seconds.index)].assign(duration=seconds)


def compute_frame(run: MeasuredRun, idle: float | None = None, growth: "Growth | None" = None,
                  dispatch: float = 0.0) -> pd.DataFrame:
    """The run's compute rows: step, rank, stage, kind, switch (schedules.analysis.switches),
    length (schedules.analysis.run_lengths), place class (schedules.analysis.places up to `later_place`) and duration (seconds; for
    ranks that shared fewer cores than there were ranks, `full_speed` with `idle` the share of
    a core a rank not computing takes, default the run's own `fit_idle_share`), plus `dispatch`,
    over `growth`'s factor at the row's start (default none): what it costs at a step's start."""
    frame = _compute_rows(run)
    cores = shared_cores(run)
    if cores is not None:  # what each action would have cost on its own processor
        rows = run.timeline.loc[frame.index]
        frame["duration"] = full_speed(rows["step"].to_numpy(), rows["start"].to_numpy(), rows["end"].to_numpy(),
                                       cores, host_ranks(run), fit_idle_share(run) if idle is None else idle)
    frame["duration"] += dispatch
    return (growth or Growth()).at_step_start(frame, run)


def step_spans(run: MeasuredRun, dispatch: float, post: float) -> list[float]:
    """Per step, the part of its step time (rank 0's, from its barrier exit) that the simulated
    makespan stands for: from the simulator's time 0 to the latest row end, a compute row ending
    `dispatch` later (the simulated row holds the gap). On one clock time 0 is where rank 0's
    first row says (that row's start less its simulated lead, `post` times the receives rank 0
    posts first); what rank 0 does before that (posting that `post` does not explain) stays in
    the step overhead, as the simulator does not replay it. On rank clocks, which cannot tell
    when rank 0 started against the others, it is the earliest row's start less the simulated
    lead of the rank that posts fewest first."""
    timeline, posts = run.timeline, first_posts(run)
    if run.one_clock:
        anchor, lead = timeline[timeline["rank"] == 0], post * posts[0]
    else:
        anchor, lead = timeline, post * min(posts, default=0)
    zero = anchor["start"].groupby(anchor["step"]).min() - lead
    ends = timeline["end"] + np.where(timeline["kind"].isin(COMPUTE_NAMES), dispatch, 0.0)
    return [float(x) for x in (ends.groupby(timeline["step"]).max() - zero).sort_index()]


def in_run_fits(points: Mapping[str, Sequence[tuple[str, int, float]]],
                profiled: Mapping[str, LinearCost]) -> dict[str, LinearCost]:
    """Per kind: fixed and per-layer costs from several runs' own stages (`points`: role,
    layers, measured cost), where the runs hold stages of two or more sizes (module docstring,
    several runs); `profiled` (the runs' mean anchored profile fits) where they do not."""
    sized = {k: fit_linear(v)[0] for k, v in points.items() if len({n for _, n, _ in v}) >= 2}
    sized = {k: f for k, f in sized.items() if f.per_layer > 0}  # noise that inverts the sizes: keep the profile's
    ratios = [sized[k].per_layer / profiled[k].per_layer for k in sized if profiled[k].per_layer > 0]
    out = {}
    for kind, fit in profiled.items():
        if kind not in points:  # timed by the profiles only (sim.calibration.fit_compute)
            out[kind] = fit
            continue
        like_forward = split_like_forward(points[kind], sized.get("F")) if kind == SPLIT_FORWARD else None
        if kind in sized:
            measured = sized[kind]
        elif like_forward is not None:
            out[kind] = like_forward
            continue
        elif ratios:  # one size: the slope the other kinds' in-run fits give the profile's
            slope = fit.per_layer * float(np.mean(ratios))
            roles = sorted({r for r, _, _ in points[kind]}, key=ROLES.index)
            measured = LinearCost(slope, {r: float(np.mean([v - n * slope for q, n, v in points[kind] if q == r]))
                                          for r in roles})
        else:
            out[kind] = fit
            continue
        shared = [measured.fixed[r] - fit.fixed[r] for r in measured.fixed if r in fit.fixed]
        shift = float(np.mean(shared)) if shared else 0.0  # roles no run holds: the profile's, moved alike
        fixed = {**{r: v + shift for r, v in fit.fixed.items()}, **measured.fixed}
        out[kind] = LinearCost(measured.per_layer, {r: fixed[r] for r in sorted(fixed, key=ROLES.index)})
    return out


def split_like_forward(points: Sequence[tuple[str, int, float]], forward: LinearCost | None) -> LinearCost | None:
    """The split forward measured at one stage size (`points`: role, layers, cost), where F's
    in-run fit (`forward`, None where F was not seen at two sizes) is known: F's work plus a bridge
    per weight layer (runtime.split), so F's fit times the ratio the split runs measured. Anchored
    at one size as other kinds are, its bridges went into the fixed terms, and ZBV's half-size
    stages came out 1.3x F where runs measured 1.0-1.1x (mlp 2 rows, sweep 17)."""
    shared = [(r, n, v) for r, n, v in points if forward is not None and r in forward.fixed]
    if not shared:
        return None
    return forward.scaled(float(np.mean([v / forward.at(r, n) for r, n, v in shared])))


def fit_linear(points: Sequence[tuple[str, int, float]]) -> tuple[LinearCost, float]:
    """Least squares of value = fixed[role] + layers x per_layer; returns the fit and its RMS residual."""
    roles = sorted({r for r, _, _ in points}, key=ROLES.index)
    if len({n for _, n, _ in points}) < 2:
        raise CostError("the profile needs stage calls at two or more layer counts to separate fixed from per-layer costs")
    a = np.zeros((len(points), len(roles) + 1))
    y = np.zeros(len(points))
    for i, (role, n, value) in enumerate(points):
        a[i, roles.index(role)] = 1.0
        a[i, -1] = n
        y[i] = value
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    residual = float(np.sqrt(np.mean((a @ coef - y) ** 2)))
    return LinearCost(float(coef[-1]), {r: float(coef[i]) for i, r in enumerate(roles)}), residual


def fit_bandwidth(one_way: Mapping[str, Sequence[float]]) -> tuple[float, float]:
    """(latency, bandwidth) from ping-pong one-way times per byte size: least squares on medians."""
    sizes = sorted(int(k) for k in one_way)
    if len(sizes) < 2:
        raise CostError("the ping-pong needs two or more sizes to separate latency from bandwidth")
    x = np.array(sizes, dtype=float)
    y = np.array([median(one_way[str(k)]) for k in sizes])
    slope, intercept = np.polyfit(x, y, 1)
    if slope <= 0:
        return max(float(np.min(y)), 0.0), math.inf
    return max(float(intercept), 0.0), float(1.0 / slope)
