"""bench/freed_memory.py: each setting reaches its run (the summary says which it got), the ratios
are of the step times it printed, and a bad argument is one line and exit 2."""

import json
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "freed_memory.py"


def test_one_round_of_tiny_runs_prints_each_setting_and_the_ratios_of_its_steps(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--rounds", "1", "--rows", "2", "--m", "2",
                           "--steps", "1", "--warmup", "0"], capture_output=True, text=True, timeout=300,
                          cwd=SCRIPT.parents[1])
    assert done.returncode == 0, done.stderr
    rows = re.findall(r"^\| 0 \| (gpipe|1f1b) \| (\S+) \| ([\d.]+) \|", done.stdout, re.M)
    assert [(s, k) for s, k, _ in rows] == [("gpipe", "keep"), ("gpipe", "release"), ("1f1b", "keep"), ("1f1b", "release")]
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("the settings are glibc's; the rest ran")
    step = {(s, k): json.loads((tmp_path / f"{s}-{k}-r0" / "summary.json").read_text())["step_time_median"]
            for s, k, _ in rows}
    assert [(s, k) for s, k, _ in rows] == [(s, json.loads((tmp_path / f"{s}-{k}-r0" / "summary.json").read_text())[
        "freed_memory"]) for s, k, _ in rows]  # each run got the setting it was launched with
    # one round: each ratio is the quotient of the two runs' median steps
    for label, ratio in (("GPipe / 1F1B with memory keep", step["gpipe", "keep"] / step["1f1b", "keep"]),
                         ("gpipe: keep / release", step["gpipe", "keep"] / step["gpipe", "release"])):
        printed = float(re.search(re.escape(label) + r": ([\d.]+)", done.stdout).group(1))
        assert printed == pytest.approx(ratio, abs=6e-4)


@pytest.mark.parametrize("args, message", [(["--rounds", "0"], "--rounds must be at least 1, got 0"),
                                           (["--warmup", "-1"], "--warmup must be 0 or more, got -1")])
def test_a_bad_argument_is_one_line_and_exit_2(tmp_path, args, message):
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), *args], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].endswith(message), done.stderr
