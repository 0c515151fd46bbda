"""bench/processor_sharing.py: flat under the engine's own processor sharing, u = 1 in closed form
when idle ranks take the cores as well, and one clear line for a run it cannot read."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import schedules
from sim import CostModel, simulate
from scripts import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "processor_sharing.py"


def load_bench():
    return load_script(SCRIPT)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1"])
def test_a_timeline_under_processor_sharing_is_flat(name: str) -> None:
    """The engine shares 2 cores among 4 ranks' compute exactly as the check assumes, so every
    action's own-core estimate is its cost: every bin at 1, u = 0."""
    bench = load_bench()
    model = CostModel(forward=1e-3, backward_full=2e-3, backward_input=1e-3, backward_weight=1e-3, cores=2)
    timeline = simulate(schedules.build(name, ranks=4, microbatches=8), model).timeline
    table = bench.concurrency_table(timeline, 2)
    assert table["median"].to_numpy() == pytest.approx(1.0)
    demands = [bench.idle_demand(table.loc[kind], 2, 4) for kind in table.index.get_level_values("kind").unique()]
    assert any(u is not None for u in demands)
    assert [u for u in demands if u is not None] == pytest.approx([0.0] * sum(u is not None for u in demands))


def test_idle_ranks_that_take_the_cores_give_u_one() -> None:
    """4 ranks of 1 s of work on 2 cores. Step 0: ranks 0 and 1 compute while 2 and 3 spin, so each
    takes 2 s (processor sharing among compute would say 1 s); step 1: all four compute, 2 s each;
    step 2: ranks 2 and 3 compute while 0 and 1 spin. Own-core estimates: 2 s alone, 1 s beside
    three others, so the top bin is half the bottom one and u = (2 - 1) x 2 / 2 = 1."""
    bench = load_bench()
    rows = [(step, rank) for step, ranks in ((0, (0, 1)), (1, (0, 1, 2, 3)), (2, (2, 3))) for rank in ranks]
    timeline = pd.DataFrame({"step": [s for s, _ in rows], "rank": [r for _, r in rows], "stage": [r for _, r in rows],
                             "kind": "F", "start": 0.0, "end": 2.0})
    table = bench.concurrency_table(timeline, 2)
    cells = table.loc["F"]
    assert cells.loc["<=c", "median"] == pytest.approx(4 / 3) and cells.loc["~2c", "median"] == pytest.approx(2 / 3)
    assert bench.idle_demand(cells, 2, 4) == pytest.approx(1.0)
    assert bench.idle_demand(cells, 2, 3) is None  # the top bin is not every rank computing


def test_a_missing_run_is_one_clear_line(tmp_path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "absent")], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error:")
    assert "Traceback" not in done.stderr
