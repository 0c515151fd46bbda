"""bench/processor_sharing.py: flat under the engine's own processor sharing, u = 1 in closed form
when idle ranks take the cores as well, and one clear line for a run it cannot read."""

import subprocess
import sys
from pathlib import Path

import dataclasses
from types import SimpleNamespace

import numpy as np
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


def test_measured_speed_and_off_compute_share_in_closed_form() -> None:
    """4 ranks on 2 cores. Step 0 (4 s): ranks 0 and 1 compute over [0, 2] with 1.5 s of CPU
    each, ranks 2 and 3 over [1, 3] with 1 s each, so every row runs beside 3 rows on average
    (2 fully, 2 for half its span): k = 3, speed 5 / 8, processor sharing's 2 / 3. Step 1
    (2 s): rank 0 alone over [0, 1] with 0.9 s: k = 1, speed 0.9. Each process uses 0.5 s of
    CPU per step beyond its actions' (rank 0: 2.0 s and 1.4 s), over its wall time off compute
    (rank 0: 2 s and 1 s; ranks 1-3: 2 s in step 0 and 2 s in step 1)."""
    bench = load_bench()
    rows = [(0, 0, 0.0, 2.0, 1.5), (0, 1, 0.0, 2.0, 1.5), (0, 2, 1.0, 3.0, 1.0), (0, 3, 1.0, 3.0, 1.0),
            (1, 0, 0.0, 1.0, 0.9)]
    timeline = pd.DataFrame({"step": [r[0] for r in rows], "rank": [r[1] for r in rows], "stage": [r[1] for r in rows],
                             "kind": "F", "action": [f"{r[1]}F0" for r in rows],
                             "start": [r[2] for r in rows], "end": [r[3] for r in rows]})
    cpu = pd.DataFrame({"step": [r[0] for r in rows], "rank": [r[1] for r in rows],
                        "action": [f"{r[1]}F0" for r in rows], "thread_cpu": [r[4] for r in rows]})
    process = [[2.0, 1.4], [2.0, 0.5], [1.5, 0.5], [1.5, 0.5]]
    summary = {"device": "cpu", "cpu_cores": 2, "local_world_size": 4, "ranks": 4, "process_cpu_seconds": process}
    run = SimpleNamespace(timeline=timeline, cpu=cpu, summary=summary, step_times=[4.0, 2.0])
    table = bench.measured_speed(run, 2)
    assert list(table.index) == [1, 3] and list(table["actions"]) == [1, 4]
    assert table.loc[3, "speed"] == pytest.approx(5 / 8) and table.loc[3, "processor_sharing"] == pytest.approx(2 / 3)
    assert table.loc[1, "speed"] == pytest.approx(0.9) and table.loc[1, "processor_sharing"] == 1.0
    used, shares = bench.off_compute_share(run)
    assert used == pytest.approx(float(np.median([7.0 / 8.0, 2.9 / 4.0])))
    assert shares == pytest.approx([float(np.median([0.5 / 2.0, 0.5 / 1.0])), 0.25, 0.25, 0.25])


@pytest.mark.parametrize("cores", [2, 4])
def test_rank_speed_measured_from_own_core_times_is_the_models(cores: int) -> None:
    """A run that behaves exactly as the engine's processor sharing: its CPU table holds each
    compute action's own-core cost (a replay with a core per rank), its timeline the shared
    replay. The measured speed per rank is then the model's, below 1 where 4 ranks share 2
    cores and 1 exactly with a core each."""
    bench = load_bench()
    program = schedules.lower(schedules.build("1f1b", ranks=4, microbatches=8))
    model = CostModel(forward=1e-3, backward_full=2e-3, cores=cores)
    shared = simulate(program, model).timeline
    alone = simulate(program, dataclasses.replace(model, cores=None)).timeline
    compute = shared["kind"].isin(["F", "B"])
    cpu = shared.loc[compute, ["step", "rank", "action"]].assign(
        thread_cpu=(alone["end"] - alone["start"])[compute].to_numpy())
    run = SimpleNamespace(timeline=shared, cpu=cpu, program=program)
    measured = bench.measured_rank_speed(run)
    modelled = bench.model_rank_speed(run, SimpleNamespace(for_run=lambda _: model))
    assert measured == pytest.approx(modelled, rel=1e-12)
    if cores == 4:
        assert measured == pytest.approx([1.0] * 4)
    else:
        assert all(0.5 <= x < 0.99 for x in measured)


def test_a_missing_run_is_one_clear_line(tmp_path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "absent")], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error:")
    assert "Traceback" not in done.stderr


def test_main_prints_every_runs_tables(monkeypatch, capsys) -> None:
    """The command's own loop: each run's concurrency bins, its speed by concurrency and its
    speed per rank measured beside the model's, for a run that shares cores exactly as the
    engine does (bins at 1, u = 0; measured speed per rank equal to the model's)."""
    bench = load_bench()
    program = schedules.lower(schedules.build("1f1b", ranks=4, microbatches=8))
    model = CostModel(forward=1e-3, backward_full=2e-3, cores=2)
    shared = simulate(program, model).timeline
    alone = simulate(program, dataclasses.replace(model, cores=None)).timeline
    compute = shared["kind"].isin(["F", "B"])
    cpu = shared.loc[compute, ["step", "rank", "action"]].assign(
        thread_cpu=(alone["end"] - alone["start"])[compute].to_numpy())
    step = float(shared["end"].max())
    summary = {"device": "cpu", "cpu_cores": 2, "local_world_size": 4, "ranks": 4,
               "process_cpu_seconds": [[float(cpu.loc[cpu["rank"] == r, "thread_cpu"].sum())] for r in range(4)]}
    run = SimpleNamespace(timeline=shared, cpu=cpu, program=program, summary=summary, step_times=[step])
    monkeypatch.setattr(bench, "read_shared", lambda path: (run, 2, 4))
    monkeypatch.setattr(bench.Calibration, "from_dict", staticmethod(lambda *_: SimpleNamespace(for_run=lambda _: model)))
    monkeypatch.setattr(bench, "read_json", lambda path: {})
    monkeypatch.setattr(sys, "argv", ["processor_sharing.py", "runs/a", "runs/b", "--costs", "cal.json"])
    assert bench.main() == 0
    out = capsys.readouterr().out
    bins = [line for line in out.splitlines() if line.startswith("| a |") or line.startswith("| b |")]
    assert {line.split(" | ")[1] for line in bins} >= {"F", "B"}  # a row per run and kind, both runs
    assert sum(line.startswith("| a | F |") for line in bins) == 1 and sum(line.startswith("| b | F |") for line in bins) == 1
    assert all(line.endswith("| 0.00 |") for line in bins if " | F | " in line)
    speeds = [line for line in out.splitlines() if line.startswith("| a | 0.") or line.startswith("| b | 0.")]
    assert len(speeds) == 2
    measured, modelled = speeds[0].split(" | ")[1:3]
    assert measured.split() == modelled.split(" |")[0].split()
