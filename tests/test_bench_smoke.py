"""bench/zero_bubble_vs_1f1b.py: its statistics in closed form, a tiny end-to-end run, bad flags."""

import random
import subprocess
import sys
from pathlib import Path

import pytest
from scripts import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "zero_bubble_vs_1f1b.py"
TINY = ["--layers", "4", "--hidden", "32", "--heads", "2", "--seq-len", "8", "--vocab", "32", "--batch-size", "8",
        "--microbatches", "4", "--steps", "3", "--warmup", "1", "--split-rounds", "2", "--split-warmup", "1"]


def load_bench():
    return load_script(SCRIPT)


def test_quantile_interpolates_linearly():
    bench = load_bench()
    assert bench.quantile([1.0, 2.0, 3.0, 4.0], 0.25) == pytest.approx(1.75)
    assert bench.quantile([1.0, 2.0, 3.0, 4.0], 0.75) == pytest.approx(3.25)
    assert bench.quantile([5.0], 0.5) == 5.0


def test_ratio_stats_of_a_constant_ratio_has_no_spread():
    bench = load_bench()
    base = tuple(random.Random(1).uniform(0.1, 0.2) for _ in range(9))
    ratio, lo, hi, q1, q3 = bench.ratio_stats(tuple(1.25 * b for b in base), base, random.Random(0))
    for value in (ratio, lo, hi, q1, q3):
        assert value == pytest.approx(1.25)


def test_ratio_stats_median_and_quartiles():
    bench = load_bench()
    base = (1.0, 1.0, 1.0, 1.0, 1.0)
    ratio, lo, hi, q1, q3 = bench.ratio_stats((0.9, 1.0, 1.1, 1.2, 1.3), base, random.Random(0))
    assert ratio == pytest.approx(1.1)
    assert (q1, q3) == (pytest.approx(1.0), pytest.approx(1.2))
    assert 0.9 <= lo <= 1.1 <= hi <= 1.3


def table(text: str, first: str) -> dict[str, list[str]]:
    """Rows of the markdown table whose header starts with `first`, keyed by the first cell."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first} |"))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def test_tiny_run_prints_both_tables():
    done = subprocess.run([sys.executable, str(SCRIPT), *TINY], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    pipeline = table(done.stdout, "schedule")
    others = ["zb-h1", "zb-h2", "zbv", "dualpipev", "zb-auto-1p", "zb-auto-2p"]
    assert list(pipeline) == ["1f1b", *others]
    assert pipeline["1f1b"][1] == "1 (base)"
    base = float(pipeline["1f1b"][0])
    for name in others:
        step, ratio, ci = float(pipeline[name][0]), float(pipeline[name][1]), pipeline[name][2]
        assert ratio == pytest.approx(step / base, rel=0.02, abs=0.002)  # printed medians are rounded
        lo, hi = (float(x) for x in ci.split("–"))
        assert lo <= ratio <= hi
    for cells in pipeline.values():
        assert 0.0 <= float(cells[5]) < 1.0  # bubble ratio
        assert all(int(b.replace(",", "")) > 0 for b in cells[7].split(" / "))  # peak bytes, both ranks
    assert "- zb-auto-1p (K=2): " in done.stdout and "- zb-auto-2p (K=3): " in done.stdout
    same_memory = table(done.stdout, "zb-auto")
    assert {k: v[0] for k, v in same_memory.items()} == {"zb-auto-1p": "zb-h1", "zb-auto-2p": "zb-h2"}
    for auto, (hand, ratio, ci, _) in same_memory.items():
        assert float(ratio) == pytest.approx(float(pipeline[auto][0]) / float(pipeline[hand][0]), rel=0.02, abs=0.002)
        lo, hi = (float(x) for x in ci.split("–"))
        assert lo <= float(ratio) <= hi
    split = table(done.stdout, "stage")
    assert list(split) == ["0", "1"]
    for cells in split.values():
        plain, split_ms, ratio = float(cells[0]), float(cells[1]), float(cells[2])
        assert ratio == pytest.approx(split_ms / plain, rel=0.05)
        f_plain, b, f_split, i, w = (float(c) for c in cells[4:9])
        assert plain == pytest.approx(f_plain + b, abs=0.15)
        assert split_ms == pytest.approx(f_split + i + w, abs=0.15)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--hidden", "30", "--heads", "4"], "--hidden 30 is not divisible by --heads 4"),
        (["--batch-size", "4", "--microbatches", "8"], "--batch-size 4 is smaller than --microbatches 8"),
        (["--steps", "0"], "--steps must be at least 1"),
        (["--layers", "3"], "fewer than"),
    ],
)
def test_bad_flags_exit_2_with_one_line(flags, message):
    done = subprocess.run([sys.executable, str(SCRIPT), *flags], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
