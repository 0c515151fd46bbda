"""The executor's profiles (runtime/profile.py) and one real run calibrated and compared end to end."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import schedules
from runtime.models import ModelSpec, build
from runtime.profile import LAYER_COUNTS, collect, write_profile
from sim.comparison import step_spread
from sim.measured import read_profile
from ranks import free_port

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
HIDDEN, BATCH, M = 16, 8, 2
ROWS = BATCH // M


@pytest.fixture()
def one_rank_group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", ["1f1b", "zb-h1"])
def test_layer_profile_times_every_role_and_counts_activations_like_the_executor(one_rank_group, tmp_path, name):
    model = build(ModelSpec(model="mlp", layers=4, hidden=HIDDEN, batch_size=BATCH))
    program = schedules.lower(schedules.build(name, ranks=2, microbatches=M))
    profile = collect(program, model, torch.device("cpu"), layers=True, p2p=True)
    assert set(profile) == {"layers"}  # one rank: no peer to ping-pong with
    layers = profile["layers"]
    assert layers["rows"] == ROWS and layers["split"] == (name == "zb-h1")
    records = layers["records"]
    assert [(r["role"], r["layers"]) for r in records] == [
        (role, n) for role in ("first", "middle", "last") for n in LAYER_COUNTS]
    kinds = ("F", "B", "F_split", "I", "W")  # both ways, whichever the run used
    tensor = ROWS * HIDDEN * 4  # one fp32 activation of a microbatch
    for r in records:
        assert all(len(r[k]) == layers["repeats"] and min(r[k]) > 0 for k in kinds)
        # Each Linear+ReLU block saves its ReLU output (the next Linear's input, one storage);
        # a middle or last stage also saves its received input, stage 0's input is the batch.
        assert r["activation_bytes"] == tensor * (r["layers"] + (r["role"] != "first"))
        # From I to W every Linear keeps its input (stage 0's first one is the batch) and the
        # gradient at its output; a 1F1B run's profile measures it too (one split call).
        assert r["weight_bytes"] == tensor * (2 * r["layers"] - (r["role"] == "first"))
        # The received input is the first Linear's input, saved from F until W; the output is
        # the last ReLU's, saved from F until I (a same-rank handover shares these storages).
        received = tensor * (r["role"] != "first")
        assert (r["input_bytes"], r["input_weight_bytes"]) == (received, received)
        assert (r["output_bytes"], r["output_weight_bytes"]) == (tensor * (r["role"] != "last"), 0)
    write_profile(tmp_path, profile)
    assert read_profile(tmp_path / "profile.json") == json.loads(json.dumps(profile))


def test_a_profile_of_one_way_names_its_split_forward_as_the_calibration_reads_it(tmp_path):
    """Profiles from before both ways were timed hold the run's way only; a split run's forward
    was "F" there. It is read as F_split, the name of a split forward everywhere else."""
    record = {"role": "first", "layers": 1, "F": [1e-3], "I": [2e-3], "W": [3e-3], "activation_bytes": 64}
    for split, key in ((True, "F_split"), (False, "F")):
        (tmp_path / "profile.json").write_text(json.dumps(
            {"layers": {"rows": 1, "repeats": 1, "warmup": 0, "split": split, "records": [record]}}))
        read = read_profile(tmp_path / "profile.json")["layers"]["records"][0]
        assert read[key] == [1e-3] and set(read) - {key} == {"role", "layers", "I", "W", "activation_bytes"}


STEPS = 20  # steps of 2-3 ms: enough for quartiles, so that the calibration can fence off stalled ones
TRIES = 5
NOISY = 0.5  # step-time IQR over the median: above it the median step itself is in doubt


def measured_run(tmp_path: Path) -> Path:
    """A real 2-rank 1F1B run with both profiles; run again (up to TRIES times) while its step times
    spread more than NOISY. On two shared cores whole stretches of steps stall for 3-4 ms (a
    thread waiting a scheduler tick for a core): 3 of 10 runs of 2026-12-06 had 45-60% of their
    steps stalled (IQR 0.65-1.45 of the median), where the median step is a coin toss between
    two modes that no calibration can replay; the other 19 of 22 runs spread 0.04-0.48. Beside
    another job busy on one core 6 of 16 runs spread more (0.60-1.25): five tries."""
    spreads = []
    for attempt in range(TRIES):
        run = tmp_path / f"run{attempt}"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        cmd = [TORCHRUN, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
               "-m", "runtime", "--schedule", "1f1b", "--microbatches", str(M), "--layers", "4", "--hidden",
               str(HIDDEN), "--batch-size", str(BATCH), "--steps", str(STEPS), "--warmup", "1", "--post-ahead", "1",
               "--profile-layers", "--profile-p2p", "--timeout", "60", "--out", str(run)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr
        spreads.append(step_spread(json.loads((run / "summary.json").read_text())["step_times"]))
        if spreads[-1] <= NOISY:
            return run
    pytest.fail(f"every run's step times spread more than {NOISY:.0%} of the median ({spreads}): the machine stalls")


def test_a_real_run_calibrates_and_compares(tmp_path):
    run = measured_run(tmp_path)
    profile = json.loads((run / "profile.json").read_text())
    assert set(profile) == {"layers", "p2p"}
    assert {r["rank"] for r in profile["layers"]["records"]} == {0, 1}
    boundary = ROWS * HIDDEN * 4
    assert str(boundary) in profile["p2p"]["one_way_seconds"]
    costs = tmp_path / "costs.json"
    done = subprocess.run([sys.executable, "-m", "sim", "calibrate", str(run), "-o", str(costs)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([sys.executable, "-m", "sim", "compare", "--measured", str(run), "--costs", str(costs),
                           "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    # Activation bytes are exact on both sides: the profile's byte counts give the simulated stages'.
    assert record["peak_activation_bytes_simulated"] == record["peak_activation_bytes_measured"]
    assert record["makespan_simulated"] > 0 and record["step_time_measured"] > 0
    # Replaying the calibration's own run. Its steps last 2-10 ms, mostly executor overhead and
    # transfers on two shared cores. Repeats of this procedure (measured_run, then calibrate and
    # compare) on the 2-core development machine, 2026-12-06: 22 quiet runs (6 posting at each
    # RECV), step-time errors -9.5% to
    # +5.1% where the steps spread at most NOISY; 16 runs beside a calibration busy on one
    # core, -13.3% to +16.4% where they did (6 spread more and were run again). Before stalled
    # steps were fenced off (sim.calibration.far_out_steps) a 2-step run failed CI at +77%.
    # 30% guards against gross miscalibration only: with compute doubled in the fit two
    # repeats gave +22% and +28%, with dispatch and step overhead dropped -56% and -5%; each
    # term is checked exactly on the synthetic runs of test_calibrate.py.
    assert abs(record["step_time_error"]) < 0.3, record
    # The makespan (first action to last) is the smaller part of these steps where the machine is
    # busy (a 3.2 ms step overhead in an 8 ms step): beside the busy core it came out -9% to
    # +56% while the step time was within 16%, as the stalls the mean-fitted gaps and transfers
    # keep move from the barrier's wait into the pipeline. A gross check only.
    assert abs(record["makespan_error"]) < 1.0, record
