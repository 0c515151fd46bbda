"""A measured run's transfers: one clock per step, the load each transfer saw, and the fit of
the engine's transfer law to them.

The engine's law (sim.engine.Wire, sim.costs ``p2p_load_latency``): a transfer advances at
1 / (idle + load x k) of its whole per second, k the ranks computing at that moment, so under
a constant k it takes idle + load x k. On a CPU host a transfer's threads wait for a core the
ranks' compute holds: on the README's 4-ranks-on-2-cores runs transfers took 0.12-0.2 ms while
no rank computed and 0.6-0.9 ms on average while two did.

Where the run's ranks are on one clock (`MeasuredRun.one_clock`: CPU ranks of one host) the
transfers are read as they are. Elsewhere rank clocks are aligned only at the step's barrier, and a transfer is timed by two of them
(its SEND's start on the sender's, its RECV's end on the receiver's). Per step, each rank's
offset to rank 0's clock starts at the middle of the interval that causality allows for each
pair of ranks (nothing arrives before it is sent), chained from rank 0. That middle assumes
the fastest transfer each way takes as long, which a load-dependent law does not: a 1F1B
sender computes during its forward transfers more than during its backward ones. So where
the law has a load term the offsets and the law are fitted together, by least squares of the
transfers' times on the law's, kept within causality (`fitted_clocks`).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np

from schedules.ir import COMPUTE_NAMES, RECV_NAMES, SEND_NAMES

from .measured import MeasuredRun

GAUSS_NEWTON_STEPS = 50
CLOCK_STEPS = 50  # Gauss-Newton steps of the law and the clocks together


class TransferRow(NamedTuple):
    """One transfer of one step, on the step's common clock (seconds from the step's start)."""

    sent: float  # SEND start
    reached: float  # RECV start: the receiver got to it
    received: float  # RECV end
    # (seconds, ranks computing) of the pieces of time from its SEND's start to its RECV's end
    segments: tuple[tuple[float, int], ...] = ()
    sender: int = 0
    receiver: int = 0
    step: int = 0
    sending: str = ""  # its SEND's action (the timeline's label)

    @property
    def load(self) -> float:
        """Ranks computing, on average, from its SEND's start to its RECV's end."""
        total = sum(d for d, _ in self.segments)
        return sum(d * k for d, k in self.segments) / total if total > 0 else 0.0

    @property
    def waited(self) -> bool:
        """Whether its receiver was waiting when it was sent (so its RECV's end is its arrival)."""
        return self.reached <= self.sent and self.received > self.sent

    @property
    def woke(self) -> bool:
        """Whether its receiver had reached its RECV before it was sent, so that its arrival
        wakes a rank that waits (sim.costs ``wake_overhead``)."""
        return self.reached < self.sent

    def woke_on_full(self, cores: int | None) -> bool:
        """Whether it woke its receiver (`woke`) while the ranks computing at its start (its
        first piece of load) and the sender filled the `cores` the ranks shared (None: a core
        each, never): what costs the sender sim.costs ``wake_overhead``."""
        return cores is not None and self.woke and bool(self.segments) and self.segments[0][1] + 1 >= cores


class StepTransfers(NamedTuple):
    """One step's transfers and compute rows, each on its own rank's clock."""

    found: tuple[tuple[int, float, int, float, float], ...]  # sender, SEND start, receiver, RECV start, end
    rank: np.ndarray  # per compute row
    start: np.ndarray
    end: np.ndarray
    step: int
    sending: tuple[str, ...]  # per transfer in `found`: its SEND's action


class RunningCount:
    """How many of a set of intervals are open over time (a step's compute rows: how many
    ranks compute), as a step function."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray) -> None:
        self.points = np.unique(np.concatenate([starts, ends]))
        self.counts = (np.searchsorted(np.sort(starts), self.points, side="right")
                       - np.searchsorted(np.sort(ends), self.points, side="right"))  # on [points[i], points[i+1])

    def segments(self, a: float, b: float) -> tuple[tuple[float, int], ...]:
        """(seconds, count) pieces of [a, b] in time order (none if b <= a)."""
        if b <= a:
            return ()
        if not len(self.points):
            return ((b - a, 0),)
        inner = self.points[(self.points > a) & (self.points < b)]
        edges = np.concatenate([[a], inner, [b]])
        at = np.searchsorted(self.points, edges[:-1], side="right") - 1
        counts = np.where(at >= 0, self.counts[np.maximum(at, 0)], 0)
        return tuple((float(d), int(k)) for d, k in zip(np.diff(edges), counts))


def transfer_rows(run: MeasuredRun, loads: bool = True) -> list[TransferRow]:
    """Per transfer of every step: when it was sent, its RECV's start and end, and (with
    `loads`) the ranks that computed meanwhile, on one clock per step (the run's own where it
    has one; else, module docstring, the offsets start at causality's middle and are then fitted with the transfer law where it has
    a load term). Without `loads` no transfer has pieces of load, so the law fitted to them is
    the mean transfer time and the clocks stay at causality's middle."""
    steps = step_transfers(run)
    if not loads:
        steps = [step._replace(rank=step.rank[:0], start=step.start[:0], end=step.end[:0]) for step in steps]
    ranks = run.program.schedule.ranks
    if run.one_clock:
        offsets = [np.zeros(ranks)] * len(steps)
    else:
        offsets = [midpoint_offsets(ranks, step.found) for step in steps]
    rows = [t for step, o in zip(steps, offsets) for t in aligned(step, o)]
    fit = transfer_fit(rows)
    if run.one_clock or fit is None or fit[1] == 0.0:
        return rows
    offsets = fitted_clocks(steps, offsets, fit)
    return [t for step, o in zip(steps, offsets) for t in aligned(step, o)]


def fitted_clocks(steps: Sequence["StepTransfers"], offsets: list[np.ndarray],
                  fit: tuple[float, float]) -> list[np.ndarray]:
    """The steps' offsets (rank 0's stays 0) fitted together with the law: Gauss-Newton on
    `transfer_fit`'s residuals over the law's two parameters and every step's offsets, a step
    halved until it lowers the sum of squares and keeps every transfer that arrived after it
    was sent so (causality; pieces of load are taken afresh at each iteration)."""
    ranks = len(offsets[0])
    x = np.array(fit)
    best = _clock_residuals(steps, offsets, x)
    for _ in range(CLOCK_STEPS):
        residual, jacobian = best[0], best[1]
        if not len(residual):
            break
        step = np.linalg.lstsq(jacobian, -residual, rcond=None)[0]
        for _ in range(30):
            trial_x = x + step[:2]
            trial = [o + np.concatenate([[0.0], step[2 + i * (ranks - 1): 2 + (i + 1) * (ranks - 1)]])
                     for i, o in enumerate(offsets)]
            if (trial_x > 0).all() and _causal(steps, offsets, trial):
                attempt = _clock_residuals(steps, trial, trial_x)
                if (attempt[0] ** 2).sum() <= (residual ** 2).sum():
                    break
            step = step / 2
        else:
            break
        moved = np.abs(step).max()
        x, offsets, best = trial_x, trial, attempt
        if moved <= 1e-12 * x.max():
            break
    return offsets


def _causal(steps, before: list[np.ndarray], after: list[np.ndarray]) -> bool:
    """Whether every transfer that arrived no earlier than it was sent under `before` still does."""
    for step, old, new in zip(steps, before, after):
        for sender, at, receiver, _, end in step.found:
            if end + old[receiver] - at - old[sender] >= 0 > end + new[receiver] - at - new[sender]:
                return False
    return True


def _clock_residuals(steps, offsets: list[np.ndarray], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`transfer_fit`'s residuals (the law's time minus the measured one) of every waited-for
    transfer and their Jacobian in (idle, load, each step's offsets of ranks 1..p-1)."""
    ranks = len(offsets[0])
    width = 2 + len(steps) * (ranks - 1)
    residuals, rows = [], []
    for i, (step, offset) in enumerate(zip(steps, offsets)):
        for t in aligned(step, offset):
            if not t.waited:
                continue
            law = law_time(t.segments, x[0], x[1])
            residuals.append(law.time - (t.received - t.sent))
            row = np.zeros(width)
            row[0], row[1] = law.by_idle, law.by_load
            base = 2 + i * (ranks - 1) - 1  # column of rank r's offset in this step: base + r
            if t.receiver > 0:  # a later receiver's clock: a longer measured time, the law's unchanged
                row[base + t.receiver] -= 1.0
            if t.sender > 0:  # a later sender's clock: shorter, and the law starts past part of its first piece
                row[base + t.sender] += law.by_start
            rows.append(row)
    return np.array(residuals), np.array(rows).reshape(len(rows), width)


class LawTime(NamedTuple):
    """The law's time of one transfer over its pieces of load, and its derivatives."""

    time: float
    by_idle: float
    by_load: float
    by_start: float  # what starting it later (its first piece shorter) adds to time minus the measured time


def law_time(segments: Sequence[tuple[float, int]], idle: float, load: float) -> LawTime:
    """When the law (module docstring) completes a transfer that meets `segments` (seconds,
    ranks computing) from its start, the load of the last piece going on past its end."""
    elapsed = done = d_idle = d_load = 0.0  # done: share of the whole; d_*: its derivatives
    first = idle + load * segments[0][1] if segments else idle
    for n, (d, k) in enumerate(segments):
        c = idle + load * k
        last = n == len(segments) - 1
        if done + d / c >= 1.0 or last:
            left = 1.0 - done
            return LawTime(elapsed + left * c, c * d_idle + left, c * d_load + left * k,
                           c / first if n > 0 else 1.0)
        elapsed += d
        done += d / c
        d_idle += d / c ** 2  # minus d(done)/d(idle)
        d_load += d * k / c ** 2
    return LawTime(idle, 1.0, 0.0, 1.0)


def step_transfers(run: MeasuredRun) -> list[StepTransfers]:
    """Every step's transfers and compute rows, as measured (each rank's own clock)."""
    transfer_of = {str(a): a.transfer for stream in run.program.streams for a in stream if a.kind.is_comm}
    out = []
    for step, rows in run.step_frames():
        sends = rows[rows["kind"].isin(SEND_NAMES)]
        sent = {transfer_of[a]: (r, t) for a, r, t in zip(sends["action"], sends["rank"], sends["start"])}
        label = {transfer_of[a]: a for a in sends["action"]}
        recvs = rows[rows["kind"].isin(RECV_NAMES)]
        found = tuple((*sent[transfer_of[a]], r, start, end)
                      for a, r, start, end in zip(recvs["action"], recvs["rank"], recvs["start"], recvs["end"]))
        compute = rows[rows["kind"].isin(COMPUTE_NAMES)]
        out.append(StepTransfers(found, compute["rank"].to_numpy(), compute["start"].to_numpy(),
                                 compute["end"].to_numpy(), step,
                                 tuple(label[transfer_of[a]] for a in recvs["action"])))
    return out


def aligned(step: StepTransfers, offset: np.ndarray) -> list[TransferRow]:
    """The step's TransferRows with each rank's times moved by its offset."""
    shift = offset[step.rank]
    computing = RunningCount(step.start + shift, step.end + shift)
    rows = []
    for (sender, at, receiver, start, end), label in zip(step.found, step.sending):
        at, start, end = at + offset[sender], start + offset[receiver], end + offset[receiver]
        rows.append(TransferRow(at, start, end, computing.segments(at, end), sender, receiver, step.step, label))
    return rows


def midpoint_offsets(ranks: int, found: Sequence[tuple[int, float, int, float, float]]) -> np.ndarray:
    """Per rank, what to add to its times of one step to put them on rank 0's clock: per pair
    of ranks that exchange transfers both ways, the middle of the interval that causality
    allows, chained from rank 0 breadth first (a pair with transfers one way only, or none,
    taken as aligned)."""
    bounds: dict[tuple[int, int], list[float]] = {}  # (low, high) -> [least, most] of high's offset to low
    for sender, at, receiver, _, end in found:
        if sender == receiver:
            continue
        low, high = min(sender, receiver), max(sender, receiver)
        pair = bounds.setdefault((low, high), [-math.inf, math.inf])
        if sender == low:
            pair[0] = max(pair[0], at - end)
        else:
            pair[1] = min(pair[1], end - at)
    pairwise = {key: (least + most) / 2 if math.isfinite(least) and math.isfinite(most) and least <= most else 0.0
                for key, (least, most) in bounds.items()}
    offset = np.zeros(ranks)
    placed, frontier = {0}, [0]
    while frontier:  # pairs in rank order, so the chain is the same every time
        rank = frontier.pop(0)
        for (low, high), o in sorted(pairwise.items()):
            if low == rank and high not in placed:
                offset[high], peer = offset[low] + o, high
            elif high == rank and low not in placed:
                offset[low], peer = offset[high] - o, low
            else:
                continue
            placed.add(peer)
            frontier.append(peer)
    return offset


def transfer_time(transfers: Sequence[TransferRow]) -> float | None:
    """Mean in-run transfer time of `transfers` (`transfer_rows`), or None if no receiver ever
    waited."""
    delays = transfer_delays(transfers)
    return float(np.mean(delays)) if delays else None


def transfer_delays(transfers: Sequence[TransferRow]) -> list[float]:
    """Every in-run transfer time: RECV end - SEND start of `transfers` (`transfer_rows`) whose
    receiver was already waiting when the send started."""
    return [t.received - t.sent for t in transfers if t.waited]


def transfer_fit(transfers: Sequence[TransferRow]) -> tuple[float, float] | None:
    """(idle, load) of the transfer law (module docstring), fitted to the in-run transfers whose
    receiver waited and the ranks that computed meanwhile (TransferRow.segments). Least
    squares, in seconds, of each transfer's measured time minus the law's over the same pieces
    of load (`law_time`, the last piece's load going on past the measured end): under a
    constant k this is the regression of T on k (the mean time, as before, where k does not
    vary; means because a step adds transfer times up), and it is exact for transfers that
    follow the law. A law that made transfers at load stall would predict them forever, so
    this cannot run off to an infinite load term. Gauss-Newton from that regression on the
    mean k. A slope that is not positive, or loads that do not vary, give load 0 and the mean
    time; None if no receiver ever waited."""
    waited = [t for t in transfers if t.waited]
    if not waited:
        return None
    delays = np.array([t.received - t.sent for t in waited])
    loads = np.array([t.load for t in waited])
    mean = (float(delays.mean()), 0.0)
    if np.ptp(loads) <= 1e-12:
        return mean
    slope, intercept = np.polyfit(loads, delays, 1)
    if not (slope > 0 and intercept > 0):
        return mean
    x = np.array([intercept, slope])
    for _ in range(GAUSS_NEWTON_STEPS):
        laws = [law_time(t.segments, x[0], x[1]) for t in waited]
        residual = np.array([law.time for law in laws]) - delays
        jacobian = np.array([[law.by_idle, law.by_load] for law in laws])
        step = np.linalg.lstsq(jacobian, -residual, rcond=None)[0]
        while (x + step <= 0).any():  # stay where times are positive
            step /= 2
        x = x + step
        if np.abs(step).max() <= 1e-12 * x.max():
            break
    return float(x[0]), float(x[1])


def transfer_residuals(transfers: Sequence[TransferRow], fit: tuple[float, float] | None) -> np.ndarray:
    """Each in-run transfer time (`transfer_delays`) over the law's (`fit`, from `transfer_fit`)
    over the same pieces of load (`law_time`): what the transfer spread draws; none if no
    receiver waited or the times are not positive."""
    if fit is None:
        return np.array([])
    waited = [t for t in transfers if t.waited]
    delays = np.array([t.received - t.sent for t in waited])
    expected = np.array([law_time(t.segments, *fit).time for t in waited])
    if delays.mean() <= 0 or not (expected > 0).all():
        return np.array([])
    return delays / expected


def early_receive_times(transfers: Sequence[TransferRow], fit: tuple[float, float]) -> list[float]:
    """RECV row durations of receives reached once the law (`transfer_fit`'s (idle, load)) had
    done the whole transfer over the pieces of load from its SEND's start (the data was there):
    what a RECV costs its rank when nothing is left to wait for (18-30 us on the README
    example's runs), rather than a low quantile of every RECV row, most of which include
    waiting. Without a load term: receives reached at least the mean transfer time after
    their SEND started."""
    idle, load = fit
    out = []
    for t in transfers:
        if t.reached <= t.sent:
            continue
        left, done = t.reached - t.sent, 0.0
        for d, k in t.segments:
            done += min(d, left) / (idle + load * k)
            left -= d
            if left <= 0:
                break
        if done >= 1.0 - 1e-9:
            out.append(t.received - t.reached)
    return out
