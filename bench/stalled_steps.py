"""Stalled steps: each run's self-replay with far-out steps fenced off and without, side by side.

    python bench/stalled_steps.py --out runs/stalled [--runs 10] [--steps 20] [--reuse]

Makes `--runs` real runs of the shape of CI's real-run test (tests/test_calibrate_runtime.py:
1F1B, mlp 4 layers hidden 16, p=2, m=2, 4 rows per microbatch, ``--post-ahead 1``, both
profiles), one launch each: steps of 2-3 ms, mostly the executor's overheads and transfers, where
a stall of a few milliseconds is the size of a step. Each run is calibrated as ``sim calibrate``
does and replayed (its median step time, as ``sim compare --measured`` does), and again with the
fence switched off (`sim.calibration.far_out_steps` fencing nothing), so that the two columns are
the same run's. Prints one row per run (median step, spread IQR / median, the steps fenced off,
both self-replay errors) and the range of both over the runs whose steps spread at most 0.5 of
their median: a run that stalls in half its steps has no typical step for either to replay.
README's "Stalled steps are fenced off" quotes it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fidelity import LOCK, CpuLock, launch, torchrun  # noqa: E402
import sim.calibration as calibration_module  # noqa: E402
from schedules import ScheduleError  # noqa: E402
from sim.calibration import calibrate  # noqa: E402
from sim.costs import CostError  # noqa: E402
from sim.comparison import compare_run, step_spread  # noqa: E402
from sim.measured import read_measured  # noqa: E402

SHAPE = ["--schedule", "1f1b", "--microbatches", "2", "--layers", "4", "--hidden", "16", "--batch-size", "8",
         "--post-ahead", "1", "--profile-layers", "--profile-p2p"]
NOISY = 0.5  # as tests/test_calibrate_runtime.py: beyond it the median step itself is in doubt


def self_replay(run, fence: bool) -> float:
    """The signed step-time error of `run` replayed by its own calibration, fitted with or without the fence."""
    if fence:
        calibration = calibrate(run)
    else:
        with mock.patch.object(calibration_module, "far_out_steps", lambda run: []):
            calibration = calibrate(run)
    return compare_run(run, calibration.for_run(run), calibration.dispatch_overhead)[0].step_time_error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--reuse", action="store_true", help="keep runs already made")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.steps < 4:
        parser.error("--runs must be at least 1 and --steps at least 4 (quartiles of fewer fence nothing off)")
    lock = CpuLock(LOCK)
    kept = {True: [], False: []}
    print("| run | median step | spread | fenced off | self-replay, fenced | without the fence |")
    print("|---|---:|---:|---|---:|---:|")
    try:
        for i in range(args.runs):
            out = args.out / f"run{i}"
            launch([*torchrun(2), "-m", "runtime", *SHAPE, "--steps", str(args.steps), "--warmup", "1",
                    "--out", str(out)], [out], args.reuse, lock)
            run = read_measured(out)
            spread = step_spread(run.step_times)
            errors = {fence: self_replay(run, fence) for fence in (True, False)}
            if spread <= NOISY:
                for fence, error in errors.items():
                    kept[fence].append(error)
            far = calibration_module.far_out_steps(run)
            print(f"| {i} | {run.step_time_median * 1e3:.2f} ms | {spread:.2f} | {len(far)} of {len(run.steps)} | "
                  f"{100 * errors[True]:+.1f}% | {100 * errors[False]:+.1f}% |", flush=True)
    except (RuntimeError, ScheduleError, CostError, OSError) as exc:
        print(f"stalled_steps: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    finally:
        lock.release()
    if kept[True]:
        print(f"\nruns spread at most {NOISY}: {len(kept[True])} of {args.runs}; self-replay fenced "
              f"{100 * min(kept[True]):+.1f}% to {100 * max(kept[True]):+.1f}% (mean |error| "
              f"{100 * sum(map(abs, kept[True])) / len(kept[True]):.1f}%), without the fence "
              f"{100 * min(kept[False]):+.1f}% to {100 * max(kept[False]):+.1f}% (mean |error| "
              f"{100 * sum(map(abs, kept[False])) / len(kept[False]):.1f}%)")
    else:
        print(f"\nno run spread at most {NOISY}: the machine stalled throughout")
    return 0


if __name__ == "__main__":
    sys.exit(main())
