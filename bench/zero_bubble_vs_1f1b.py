"""Step time of the zero-bubble schedules against 1F1B on our executor, and what splitting backward costs.

    python bench/zero_bubble_vs_1f1b.py --layers 8 --hidden 256 --heads 8 --seq-len 64 --vocab 512 \\
        --batch-size 16 --microbatches 8

Part 2 runs first (below): its per-stage F, I and W times, per microbatch, are the costs
zb-auto plans with (sim.zb_search.auto_schedule, simulated makespan, no transfer time),
at the memory of zb-h1 (zb-auto-1p: K = p microbatches in flight) and of zb-h2
(zb-auto-2p: K = 2p-1), each microbatch counted whole until its W.

Part 1 (pipeline): spawns two ranks (gloo on CPU, one thread each) and builds, in one
process group, a `Session` for each of 1f1b, zb-h1, zb-h2, zbv, dualpipev and the two
zb-auto plans on identical copies of the same `gpt` model and batch. It alternates single steps of the sessions, rotating their
order so that none always runs first and all see the same machine load; each step is
timed from a barrier before it to a barrier after it (rank 0's clock). It prints, per
schedule, the median step time, the ratio of medians to 1f1b with a paired bootstrap 95%
interval (steps of one round resampled together) and the interquartile range of the
per-round ratios, which is how "beyond noise" is judged; the per-rank busy time (summed
F/B/I/W of a step) and the bubble ratios of the measured timelines; and the peak
activation bytes per rank from the executor's meter. Each zb-auto plan is also compared,
the same way, with the handcrafted order of the same memory (zb-h1, zb-h2).

Part 2 (split overhead): in this one process, no pipeline, for each stage of the p=2
partition it runs the stage's microbatches as F then B on one copy of the stage, and as F
then I then W on an identical copy built for a split backward, through runtime.stage.Stage
(the executor's own code path, bridges of runtime/split.py included). The two modes
alternate, rotating which goes first, and it prints the median time of each mode per
round and their ratio. A ratio above 1 is compute that zb-h1 does and 1f1b does not; if
the bubble that zb-h1 removes is smaller than that, zb-h1 is slower.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import queue as queues
import random
import socket
import sys
import time
from dataclasses import dataclass
from statistics import median

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SCHEDULES = ("1f1b", "zb-h1", "zb-h2", "zbv", "dualpipev", "zb-auto-1p", "zb-auto-2p")
# zb-auto at the memory of a handcrafted order: microbatches in flight (F done, W not) per rank.
AUTO_LIMITS = {"zb-auto-1p": lambda p: p, "zb-auto-2p": lambda p: 2 * p - 1}
SAME_MEMORY = {"zb-auto-1p": "zb-h1", "zb-auto-2p": "zb-h2"}  # the handcrafted order each is compared with
RANKS = 2
BOOTSTRAP = 2000


@dataclass(frozen=True)
class Row:
    """What rank 0 measured for one schedule."""

    schedule: str
    step_times: tuple[float, ...]  # seconds, one per round, in round order
    busy: tuple[float, ...]  # per rank: median over steps of the summed compute time
    bubble_ratio: float
    bubble_ratio_rank_span: float
    peak_activation_bytes: tuple[int, ...]


def spec_of(args: argparse.Namespace):
    from runtime import ModelSpec

    return ModelSpec(
        model="gpt", layers=args.layers, hidden=args.hidden, batch_size=args.batch_size,
        heads=args.heads, seq_len=args.seq_len, vocab=args.vocab,
    )


def busy_per_rank(timeline, ranks: int) -> tuple[float, ...]:
    """Median over steps of each rank's summed F/B/I/W time."""
    compute = timeline[timeline["kind"].isin(("F", "B", "I", "W"))]
    per_step = (compute["end"] - compute["start"]).groupby([compute["step"], compute["rank"]]).sum()
    return tuple(float(per_step.xs(r, level="rank").median()) for r in range(ranks))


def worker(rank: int, args: argparse.Namespace, programs: dict, port: int, results) -> None:
    """One rank of part 1; rank 0 puts the rows (or the error) on `results`."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(RANKS))
    dist.init_process_group("gloo", rank=rank, world_size=RANKS, timeout=datetime.timedelta(seconds=120))
    try:
        from runtime import RunOptions, Session, build_model

        spec = spec_of(args)
        options = RunOptions(timeout=120.0)
        sessions = {name: Session(program, build_model(spec), options) for name, program in programs.items()}
        names = list(sessions)
        times: dict[str, list[float]] = {k: [] for k in names}
        for i in range(args.warmup + args.steps):
            shift = i % len(names)
            for name in names[shift:] + names[:shift]:  # rotate, so no schedule always goes first
                wall = sessions[name].step(measured=i >= args.warmup)
                if i >= args.warmup:
                    times[name].append(wall)
        rows = []
        for name, session in sessions.items():
            result = session.finish()
            if rank == 0:
                summary = result.summary
                rows.append(Row(
                    name, tuple(times[name]), busy_per_rank(result.timeline, RANKS),
                    summary["bubble_ratio"], summary["bubble_ratio_rank_span"],
                    tuple(summary["peak_activation_bytes"]),
                ))
        if rank == 0:
            results.put(rows)
    except Exception as exc:
        if rank == 0:
            results.put(f"rank 0: {type(exc).__name__}: {exc}")
        raise
    finally:
        gc.collect()  # see runtime/cli.py: cycles must not keep the group alive until exit
        dist.destroy_process_group()


def run_pipeline(args: argparse.Namespace, programs: dict) -> list[Row]:
    """Part 1 on two spawned ranks; raises RuntimeError if a rank fails."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, programs, port, results)) for r in range(RANKS)]
    for proc in procs:
        proc.start()
    got = None
    try:
        while got is None:
            try:
                got = results.get(timeout=1.0)
            except queues.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"a rank failed (exit code {dead[0].exitcode})") from None
        for proc in procs:
            proc.join(timeout=60)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    if isinstance(got, str):
        raise RuntimeError(got)
    if any(proc.exitcode for proc in procs):
        raise RuntimeError("a rank failed after measuring")
    return got


def ratio_stats(times: tuple[float, ...], base: tuple[float, ...], rng: random.Random) -> tuple[float, float, float, float, float]:
    """Ratio of medians, its paired bootstrap 95% interval, and the quartiles of per-round ratios."""
    n = len(times)
    ratio = median(times) / median(base)
    boot = sorted(
        median(times[i] for i in idx) / median(base[i] for i in idx)
        for idx in ([rng.randrange(n) for _ in range(n)] for _ in range(BOOTSTRAP))
    )
    per_round = sorted(t / b for t, b in zip(times, base))
    return ratio, boot[int(0.025 * BOOTSTRAP)], boot[int(0.975 * BOOTSTRAP) - 1], quantile(per_round, 0.25), quantile(per_round, 0.75)


def quantile(ordered: list[float], q: float) -> float:
    """Linear-interpolated quantile of a sorted list."""
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


# ---------------------------------------------------------------- part 2


@dataclass(frozen=True)
class SplitRow:
    """Median seconds per round (all microbatches of one stage) of each action, by mode."""

    stage: int
    plain: float  # F + B
    split: float  # F + I + W
    ratios: tuple[float, ...]  # per round, split / plain
    f_plain: float
    b: float
    f_split: float
    i: float
    w: float


def stage_pair(args: argparse.Namespace, s: int):
    """Stage s of the p=2 partition twice (plain, split) on identical copies, with its inputs
    per microbatch and the output gradients its backward starts from (None on the last stage)."""
    from runtime import build_model, partition
    from runtime.memory import SavedTensorMeter
    from runtime.models import microbatch_sizes
    from runtime.stage import Stage

    spec = spec_of(args)
    layers = partition(args.layers, RANKS)
    m = args.microbatches
    last = s == RANKS - 1
    weights = [n / args.batch_size for n in microbatch_sizes(args.batch_size, m)]
    pair = []
    for split in (False, True):
        model = build_model(spec)
        module = model.stage_module(layers[s], s == 0, last)
        meter = SavedTensorMeter([*module.parameters(), model.inputs, model.targets])
        pair.append(Stage(
            s, module, meter,
            loss=model.loss if last else None,
            targets=list(torch.tensor_split(model.targets, m)) if last else None,
            weights=weights if last else None,
            split=split,
        ))
    model = build_model(spec)
    tokens = list(torch.tensor_split(model.inputs, m))
    if s == 0:
        inputs = tokens
    else:
        first = model.stage_module(layers[0], True, False)
        with torch.no_grad():
            inputs = [first(t) for t in tokens]
    grads = [None] * m
    if not last:
        data = torch.Generator().manual_seed(spec.seed + 2)
        with torch.no_grad():
            shapes = [pair[0].module(x).shape for x in inputs]
        grads = [torch.randn(shape, generator=data) for shape in shapes]
    return pair, inputs, grads


def run_split_overhead(args: argparse.Namespace) -> list[SplitRow]:
    """Part 2: F+B against F+I+W, per stage, alternated rounds in this process."""
    torch.set_num_threads(1)
    clock = time.perf_counter_ns
    rows = []
    for s in range(RANKS):
        (plain, split), inputs, grads = stage_pair(args, s)
        acts: dict[str, list[float]] = {k: [] for k in ("plain", "split", "f_plain", "b", "f_split", "i", "w")}
        try:
            for r in range(args.split_warmup + args.split_rounds):
                spent = dict.fromkeys(acts, 0)
                for mode in (("plain", "split") if r % 2 == 0 else ("split", "plain")):
                    stage = plain if mode == "plain" else split
                    stage.zero_grad()
                    for mb, (x, g) in enumerate(zip(inputs, grads)):
                        t0 = clock()
                        stage.forward(mb, x, mode == "split")
                        t1 = clock()
                        if mode == "plain":
                            stage.backward(mb, g)
                            t2 = clock()
                            spent["f_plain"] += t1 - t0
                            spent["b"] += t2 - t1
                        else:
                            stage.backward_input(mb, g)
                            t2 = clock()
                            stage.backward_weight(mb)
                            t3 = clock()
                            spent["f_split"] += t1 - t0
                            spent["i"] += t2 - t1
                            spent["w"] += t3 - t2
                spent["plain"] = spent["f_plain"] + spent["b"]
                spent["split"] = spent["f_split"] + spent["i"] + spent["w"]
                if r >= args.split_warmup:
                    for k, v in spent.items():
                        acts[k].append(v / 1e9)
        finally:
            split.close()
        med = {k: median(v) for k, v in acts.items()}
        ratios = tuple(a / b for a, b in zip(acts["split"], acts["plain"]))
        rows.append(SplitRow(s, med["plain"], med["split"], ratios, med["f_plain"], med["b"],
                             med["f_split"], med["i"], med["w"]))
    return rows


# ---------------------------------------------------------------- zb-auto

AUTO = "zb-auto"


def measured_costs(args: argparse.Namespace, split_rows: list[SplitRow]):
    """Part 2's per-stage F, I, W medians, per microbatch, as a sim.CostModel (seconds)."""
    from sim import CostModel

    m = args.microbatches
    return CostModel(forward=[r.f_split / m for r in split_rows], backward_input=[r.i / m for r in split_rows],
                     backward_weight=[r.w / m for r in split_rows])


def programs_for(args: argparse.Namespace, split_rows: list[SplitRow]) -> dict:
    """The lowered program of every schedule, zb-auto planned on part 2's costs."""
    import schedules
    from sim.zb_search import auto_schedule

    costs = measured_costs(args, split_rows)
    programs = {}
    for name in args.schedules:
        if name in AUTO_LIMITS:
            schedule = auto_schedule(costs, RANKS, args.microbatches, AUTO_LIMITS[name](RANKS))
        else:
            schedule = schedules.build(name, ranks=RANKS, microbatches=args.microbatches)
        programs[name] = schedules.lower(schedule)
    return programs


# ---------------------------------------------------------------- main


def check_args(args: argparse.Namespace) -> None:
    """Raise ConfigError or ScheduleError on a configuration no rank could run."""
    import schedules
    from runtime import partition
    from runtime.models import microbatch_sizes

    spec_of(args).check()
    microbatch_sizes(args.batch_size, args.microbatches)
    for name in args.schedules:
        schedule = schedules.build(AUTO if name in AUTO_LIMITS else name, ranks=RANKS, microbatches=args.microbatches)
        partition(args.layers, schedule.num_stages)
    for value, flag in ((args.steps, "--steps"), (args.split_rounds, "--split-rounds")):
        if value < 1:
            raise ValueError(f"{flag} must be at least 1; got {value}")
    for value, flag in ((args.warmup, "--warmup"), (args.split_warmup, "--split-warmup")):
        if value < 0:
            raise ValueError(f"{flag} must be 0 or more; got {value}")


def print_tables(args: argparse.Namespace, rows: list[Row], split_rows: list[SplitRow], loads: list,
                 programs: dict) -> None:
    rng = random.Random(0)
    base = rows[0].step_times  # 1f1b always runs first in the list
    print()
    print(f"gpt --layers {args.layers} --hidden {args.hidden} --heads {args.heads} --seq-len {args.seq_len} "
          f"--vocab {args.vocab} --batch-size {args.batch_size}, p={RANKS}, m={args.microbatches}, gloo on CPU, "
          f"1 thread per rank, {args.steps} alternated steps each after {args.warmup} warm-up, torch {torch.__version__}; "
          f"1-min load average {loads[0]:.2f} before the run (then {loads[1]:.2f} after part 2 and "
          f"{loads[2]:.2f} after part 1, which count this bench's own processes)")
    print()
    print("| schedule | median step (ms) | ratio to 1f1b | 95% CI (bootstrap) | per-step ratio IQR | busy per rank (ms) "
          "| bubble ratio | rank-span bubble | peak activation bytes per rank |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        step = median(row.step_times)
        if row.schedule == "1f1b":
            ratio, ci, iqr = "1 (base)", "—", "—"
        else:
            value, lo, hi, q1, q3 = ratio_stats(row.step_times, base, rng)
            ratio, ci, iqr = f"{value:.3f}", f"{lo:.3f}–{hi:.3f}", f"{q1:.3f}–{q3:.3f}"
        busy = " / ".join(f"{b * 1e3:.1f}" for b in row.busy)
        peak = " / ".join(f"{b:,}" for b in row.peak_activation_bytes)
        print(f"| {row.schedule} | {step * 1e3:.1f} | {ratio} | {ci} | {iqr} | {busy} | "
              f"{row.bubble_ratio:.3f} | {row.bubble_ratio_rank_span:.3f} | {peak} |")
    by_name = {row.schedule: row for row in rows}
    pairs = [(auto, hand) for auto, hand in SAME_MEMORY.items() if auto in by_name and hand in by_name]
    if pairs:
        print()
        print("| zb-auto | against, same memory | ratio of medians | 95% CI (bootstrap) | per-step ratio IQR |")
        print("|---|---|---|---|---|")
        for auto, hand in pairs:
            value, lo, hi, q1, q3 = ratio_stats(by_name[auto].step_times, by_name[hand].step_times, rng)
            print(f"| {auto} | {hand} | {value:.3f} | {lo:.3f}–{hi:.3f} | {q1:.3f}–{q3:.3f} |")
    costs = measured_costs(args, split_rows)
    planned = [name for name in programs if name in AUTO_LIMITS]
    if planned:
        print()
        print("zb-auto planned on part 2's costs per microbatch, F " + " / ".join(f"{x * 1e3:.2f}" for x in costs.forward)
              + " ms, I " + " / ".join(f"{x * 1e3:.2f}" for x in costs.backward_input)
              + " ms, W " + " / ".join(f"{x * 1e3:.2f}" for x in costs.backward_weight) + " ms (stage 0 / 1):")
        for name in planned:
            schedule = programs[name].schedule
            print(f"- {name} (K={AUTO_LIMITS[name](RANKS)}): "
                  + "; ".join(" ".join(str(a) for a in row) for row in schedule.order))
    print()
    print(f"Split backward on one process (runtime.stage.Stage, stages of the p={RANKS} partition, all {args.microbatches} "
          f"microbatches per round, median of {args.split_rounds} alternated rounds after {args.split_warmup} warm-up):")
    print()
    print("| stage | F+B (ms) | F+I+W (ms) | (F+I+W) / (F+B) | per-round ratio IQR | F plain (ms) | B (ms) "
          "| F split (ms) | I (ms) | W (ms) | (I+W) / B |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in split_rows:
        ordered = sorted(r.ratios)
        print(f"| {r.stage} | {r.plain * 1e3:.1f} | {r.split * 1e3:.1f} | {r.split / r.plain:.3f} | "
              f"{quantile(ordered, 0.25):.3f}–{quantile(ordered, 0.75):.3f} | {r.f_plain * 1e3:.1f} | {r.b * 1e3:.1f} | "
              f"{r.f_split * 1e3:.1f} | {r.i * 1e3:.1f} | {r.w * 1e3:.1f} | {(r.i + r.w) / r.b:.3f} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--schedules", nargs="+", default=list(SCHEDULES[1:]), choices=SCHEDULES[1:],
                   help="schedules to compare with 1f1b (which always runs)")
    p.add_argument("--steps", type=int, default=30, help="timed steps of each schedule")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps of each schedule first")
    p.add_argument("--split-rounds", type=int, default=15, help="timed rounds of each mode in part 2")
    p.add_argument("--split-warmup", type=int, default=2, help="untimed rounds of each mode first")
    args = p.parse_args(argv)
    args.schedules = ["1f1b", *dict.fromkeys(args.schedules)]
    try:
        check_args(args)
    except ValueError as exc:  # ConfigError and ScheduleError are ValueErrors
        print(f"error: {exc}", file=sys.stderr)
        return 2
    loads = [os.getloadavg()[0]]
    split_rows = run_split_overhead(args)
    loads.append(os.getloadavg()[0])
    programs = programs_for(args, split_rows)
    try:
        rows = run_pipeline(args, programs)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    loads.append(os.getloadavg()[0])
    print_tables(args, rows, split_rows, loads, programs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
