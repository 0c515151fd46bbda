"""Peak activation bytes: the executor's meter against the simulator, on real runs.

One 1F1B run per model (with --profile-layers) is calibrated; every other schedule, run for
real, must then be simulated with exactly the peak bytes per rank its executor measured:
split backward (what I keeps for W, which for these models exceeds what F saved), stages
of two sizes, and V-shapes whose turn hands a microbatch over on one rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim import simulate
from sim.calibration import Calibration, calibrate
from sim.measured import read_measured
from ranks import free_port

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
MODELS = {
    "mlp": ["--model", "mlp", "--layers", "8", "--hidden", "16", "--batch-size", "16"],
    "gpt": ["--model", "gpt", "--layers", "8", "--hidden", "16", "--heads", "2", "--seq-len", "8", "--vocab", "32",
            "--batch-size", "16"],
}
HELD_OUT = [("gpipe", 4, None), ("interleaved", 4, 2), ("zb-h1", 4, None), ("zb-h2", 4, None), ("zbv", 4, None),
            ("dualpipev", 4, None)]


def run(out: Path, model: str, schedule: str, m: int, chunks: int | None, *extra: str) -> Path:
    cmd = [TORCHRUN, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "runtime", "--schedule", schedule, "--microbatches", str(m), *MODELS[model],
           "--timeout", "60", "--out", str(out), *extra]
    if chunks:
        cmd += ["--chunks", str(chunks)]
    done = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module", params=sorted(MODELS))
def calibrated(request, tmp_path_factory):
    model = request.param
    base = tmp_path_factory.mktemp(model)
    path = run(base / "1f1b", model, "1f1b", 4, None, "--steps", "1", "--warmup", "0", "--profile-layers")
    calibration = calibrate(read_measured(path))
    assert calibration.handover_memory  # the profile's storage counts, kept through JSON:
    return model, base, Calibration.from_dict(json.loads(json.dumps(calibration.to_dict())))


@pytest.mark.parametrize("schedule, m, chunks", HELD_OUT)
def test_simulated_peaks_equal_the_executors(calibrated, schedule, m, chunks):
    model, base, calibration = calibrated
    measured = read_measured(run(base / f"{schedule}-m{m}", model, schedule, m, chunks, "--steps", "1",
                                 "--warmup", "0"))
    result = simulate(measured.program, calibration.for_run(measured))
    assert result.peak_activation_bytes == measured.summary["peak_activation_bytes"]
