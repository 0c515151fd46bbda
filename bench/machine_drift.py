"""How much this machine's own speed drifts, with no pipeline, executor or transfer in the way.

    python bench/machine_drift.py [--work mlp|python] [--seconds 20] [--rounds 3] [--rows 8] [--windows 1 5]

A fixed piece of work runs back to back for SECONDS, each piece timed: with `--work mlp`
(default) five forwards and backwards of the fidelity sweep's mlp (8 layers of hidden 512, ROWS
rows, one thread); with `--work python` a loop of integer arithmetic that touches no memory
beyond a few registers' worth, so that a drift it shows is the core's, not the caches' or the
allocator's. It runs first in one
process alone, then in two processes at once (the sweep's p=2 case: as many busy processes as
cores). The two phases alternate over ROUNDS, so that a slow minute of the machine falls on
both. Per phase and window length W it prints the spread of the W-second windows' medians and the
**window-to-window error**: the mean of |a - b| / b over every pair of windows (a, b) taken from
different rounds. That is the fidelity sweep's noise floor (one run predicted from another run of
the same program, minutes apart; bench/fidelity.py) for a program with no communication, no
schedule and nothing to model: what the machine alone puts between two measurements. For the
two-process phase it also prints the correlation of the two processes' window medians (a
slowdown both cores see at once, or each core its own).
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

PHASES = {"one process": 1, "two processes": 2}
PIECE_REPEATS = 5  # forward+backward passes per timed piece, so a piece is milliseconds, not microseconds
ARITHMETIC_TERMS = 100_000  # a few milliseconds of integer arithmetic per piece


@dataclass(frozen=True)
class Pieces:
    """One process's timed pieces in one phase of one round: start and duration, in ns."""

    round: int
    process: int
    starts: np.ndarray
    durations: np.ndarray


def window_medians(pieces: Pieces, window_s: float, origin_ns: int) -> dict[int, float]:
    """Median piece duration (ns) of each `window_s`-second window after `origin_ns` holding at least 3 pieces."""
    index = ((pieces.starts - origin_ns) // int(window_s * 1e9)).astype(int)
    return {
        int(w): float(np.median(pieces.durations[index == w]))
        for w in np.unique(index)
        if np.count_nonzero(index == w) >= 3
    }


def cross_round_error(medians_by_round: dict[int, list[float]]) -> float:
    """Mean |a - b| / b over ordered pairs of window medians from different rounds."""
    errors = [
        abs(a - b) / b
        for (ra, xs), (rb, ys) in itertools.permutations(medians_by_round.items(), 2)
        for a in xs
        for b in ys
        if ra != rb
    ]
    if not errors:
        raise ValueError("need window medians from at least two rounds")
    return float(np.mean(errors))


def _arithmetic() -> int:
    total = 0
    for i in range(ARITHMETIC_TERMS):
        total += i * i
    return total


def _piece(work: str, rows: int):
    """The piece of work to time, built and warmed."""
    if work == "python":
        return _arithmetic
    import torch

    from runtime.models import ModelSpec, build

    torch.set_num_threads(1)
    model = build(ModelSpec(model="mlp", layers=8, hidden=512, batch_size=rows))
    net = model.full_module()

    def passes() -> None:
        for _ in range(PIECE_REPEATS):
            model.loss(net(model.inputs), model.targets).backward()

    passes()  # warm the allocator and kernels before the clock starts
    return passes


def _work(work: str, rows: int, seconds: float, start, queue, tag: tuple[int, int]) -> None:
    piece = _piece(work, rows)
    start.wait()
    starts, durations = [], []
    stop = time.perf_counter_ns() + int(seconds * 1e9)
    while (t0 := time.perf_counter_ns()) < stop:
        piece()
        starts.append(t0)
        durations.append(time.perf_counter_ns() - t0)
    queue.put((tag, starts, durations))


def run_phase(work: str, processes: int, rows: int, seconds: float, round_: int) -> list[Pieces]:
    """Run `processes` workers at once (released together) and collect their pieces."""
    context = mp.get_context("spawn")
    start, queue = context.Barrier(processes), context.Queue()
    workers = [
        context.Process(target=_work, args=(work, rows, seconds, start, queue, (round_, p)))
        for p in range(processes)
    ]
    for w in workers:
        w.start()
    results = [queue.get(timeout=seconds + 300) for _ in workers]
    for w in workers:
        w.join()
    return [Pieces(r, p, np.array(s, dtype=np.int64), np.array(d, dtype=np.int64)) for (r, p), s, d in results]


def report(phase: str, pieces: list[Pieces], windows: list[float]) -> list[str]:
    """Lines of the table for one phase."""
    all_durations = np.concatenate([p.durations for p in pieces])
    median = float(np.median(all_durations))
    lines = [
        f"{phase}: {len(all_durations)} pieces, median {median / 1e6:.2f} ms, "
        f"pieces' 10th-90th percentile {np.percentile(all_durations, 10) / median:.2f}-"
        f"{np.percentile(all_durations, 90) / median:.2f} of it"
    ]
    for window in windows:
        by_round: dict[int, list[float]] = {}
        for p in pieces:
            by_round.setdefault(p.round, []).extend(window_medians(p, window, int(p.starts[0])).values())
        meds = np.array([m for ms in by_round.values() for m in ms])
        line = (
            f"  {window:g} s windows: {len(meds)}, medians {meds.min() / median:.2f}-{meds.max() / median:.2f} "
            f"of the phase's (sd {100 * meds.std() / median:.1f}%), window-to-window error across rounds "
            f"{100 * cross_round_error(by_round):.1f}%"
        )
        if len({p.process for p in pieces}) == 2:
            line += f", the two processes' windows correlate {_pair_correlation(pieces, window):.2f}"
        lines.append(line)
    return lines


def _pair_correlation(pieces: list[Pieces], window: float) -> float:
    """Correlation of the two processes' medians over the windows both ran in (all rounds)."""
    a_all, b_all = [], []
    for _round, group in itertools.groupby(sorted(pieces, key=lambda p: (p.round, p.process)), key=lambda p: p.round):
        a, b = list(group)
        origin = int(min(a.starts[0], b.starts[0]))
        wa, wb = window_medians(a, window, origin), window_medians(b, window, origin)
        shared = sorted(set(wa) & set(wb))
        a_all += [wa[w] / statistics.median(wa.values()) for w in shared]
        b_all += [wb[w] / statistics.median(wb.values()) for w in shared]
    return float(np.corrcoef(a_all, b_all)[0, 1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", choices=("mlp", "python"), default="mlp", help="the piece of work timed")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase (s)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both phases (at least 2)")
    parser.add_argument("--rows", type=int, default=8, help="rows of the mlp's batch")
    parser.add_argument("--windows", type=float, nargs="+", default=[1.0, 5.0], help="window lengths (s)")
    args = parser.parse_args(argv)
    if args.rounds < 2 or args.rows < 1 or min(args.windows) <= 0 or args.seconds < 3 * max(args.windows):
        print(
            "machine_drift: need --rounds >= 2, --rows >= 1, positive --windows and --seconds at least "
            "three times the longest window",
            file=sys.stderr,
        )
        return 2
    pieces: dict[str, list[Pieces]] = {phase: [] for phase in PHASES}
    for round_ in range(args.rounds):
        for phase, processes in PHASES.items():
            pieces[phase] += run_phase(args.work, processes, args.rows, args.seconds, round_)
    for phase in PHASES:
        print("\n".join(report(phase, pieces[phase], args.windows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
