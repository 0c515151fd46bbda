"""The planner's search: exact top K (against brute-force direct simulation), memory pruning that never
drops a configuration that fits, lower bounds, infeasible input, the CLI's outputs."""

import dataclasses
import json
import math

import numpy as np
import pytest

import schedules
import sim
from sim.__main__ import main
from sim.planner import PlanError, PlanRequest, Space, Transformer, make_cluster, plan
from sim.planner.programs import ProgramCache, Shape, activation_peaks
from sim.planner.search import Searcher

SMALL = Transformer("small", layers=8, hidden=1024, heads=16, ffn_hidden=4096, vocab=8192, seq_len=512)
SPACE = Space(schedules=("gpipe", "1f1b", "interleaved", "zb-h1", "zbv"), microbatch_sizes=(1, 2), chunks=(2, 4))


def request(cap_gb: float = 1.2, **kwargs) -> PlanRequest:
    cluster = make_cluster("a100-80g", 16, 8, {"memory_gb": 80})
    return PlanRequest(SMALL, cluster, 32, kwargs.pop("space", SPACE), memory_cap=cap_gb * 1e9, **kwargs)


@pytest.fixture(scope="module")
def brute():
    """Every configuration that fits, simulated (no bound pruning)."""
    searcher = Searcher(request(exhaustive=True))
    searcher.best(10**6)
    return searcher


def test_top_k_equals_brute_force_direct_simulation(brute):
    everything = brute.evaluated()
    assert len(everything) > 100
    result = plan(request(top=8))
    assert [e.config for e in result.ranked] == [e.config for e in everything[:8]]
    assert result.stats.pruned_bound > 0 and result.stats.simulated < len(everything)
    # Each ranked configuration, simulated from scratch: build, lower, simulate with its CostModel.
    for ev in result.ranked:
        c = ev.config
        built = schedules.build(c.schedule, ranks=c.pp, microbatches=c.microbatches,
                                chunks=None if schedules.generator(c.schedule).chunks else c.chunks)
        direct = sim.simulate(schedules.lower(built), ev.costs.cost_model())
        last = [end for _, end in direct.span_ns]
        step = max([direct.makespan_ns] + [a + b for a, b in zip(last, ev.costs.after_ns)])
        assert step == ev.step_ns
        assert direct.peak_bytes == ev.activation_peaks
        assert math.isclose(direct.bubble_ratio, ev.bubble_ratio)


def test_lower_bounds_hold(brute):
    bounds = {c.config: c.bound_ns for c in brute.candidates}
    for ev in brute.evaluated():
        assert bounds[ev.config] <= ev.step_ns


def test_memory_pruning_never_drops_a_config_that_fits(brute):
    cap = brute.request.cap
    programs = ProgramCache()
    dropped = [c for c in brute.candidates if not c.static_fits]
    assert dropped
    for candidate in dropped:
        c = candidate.config
        try:
            occupancy = programs.occupancy(Shape(c.schedule, c.pp, c.microbatches, c.chunks))
        except schedules.ScheduleError:
            continue
        peaks = activation_peaks(occupancy, candidate.costs.stage.memory, candidate.costs.stage.weight_memory)
        assert max(m.total + a for m, a in zip(candidate.costs.ranks_memory, peaks)) > cap
    evaluated = {e.config for e in brute.evaluated()}
    for candidate in brute.candidates:
        if candidate.config in evaluated:
            assert candidate.static_fits


@pytest.mark.parametrize("name, v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1), ("zb-h2", 1),
                                     ("zbv", 2), ("looped-bfs", 2)])
def test_order_peaks_equal_engine_peaks(name, v):
    rng = np.random.default_rng(0)
    cache = ProgramCache()
    shape = Shape(name, 4, 8, v)
    program = cache.program(shape)
    n = program.schedule.num_stages
    memory = [int(x) for x in rng.integers(1, 1000, n)]
    kept = [int(x * f) for x, f in zip(memory, 2 * rng.random(n))]  # W may keep more than F saved
    costs = sim.CostModel(forward=[1.0] * n, backward_input=[1.0] * n, backward_weight=[0.5] * n,
                          activation_memory=memory, weight_memory=kept)
    assert activation_peaks(cache.occupancy(shape), tuple(memory), tuple(kept)) == list(sim.simulate(program, costs).peak_bytes)


def test_infeasible_inputs():
    with pytest.raises(PlanError, match=r"nothing fits in 0\.05 GB per GPU"):
        plan(request(cap_gb=0.05))
    with pytest.raises(PlanError, match="do not fill whole nodes of 8"):
        make_cluster("a100-80g", 12, 8)
    with pytest.raises(PlanError, match="unknown GPU 'v100'"):
        make_cluster("v100", 8, 8)
    with pytest.raises(PlanError, match="no legal configuration"):
        plan(request(space=dataclasses.replace(SPACE, tp=(3,))))
    with pytest.raises(PlanError, match="unknown schedule 'nope'"):
        plan(request(space=dataclasses.replace(SPACE, schedules=("nope",))))


@pytest.mark.parametrize("argv, message", [
    (["--model", "nope", "--gpus", "8", "--global-batch", "8"], "unknown model 'nope'"),
    (["--model", "gpt3-175b", "--gpus", "12", "--global-batch", "8"], "do not fill whole nodes"),
    (["--model", "gpt3-175b", "--gpus", "8", "--global-batch", "8"], "nothing fits in 72 GB per GPU"),
    (["--model", "gpt3-175b", "--gpus", "8", "--gpu", "tpu", "--global-batch", "8"], "unknown GPU 'tpu'"),
    (["--model", "gpt3-175b", "--gpus", "8", "--global-batch", "8", "--set", "warp=3"], "unknown cluster key(s) warp"),
])
def test_cli_infeasible_input_one_line(capsys, argv, message):
    assert main(["plan", "--no-progress"] + argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_cli_bad_json(tmp_path, capsys):
    path = tmp_path / "model.json"
    path.write_text("{")
    assert main(["plan", "--model", str(path), "--gpus", "8", "--global-batch", "8"]) == 2
    assert "is not valid JSON" in capsys.readouterr().err


def test_cli_json_keys(capsys):
    argv = ["plan", "--model", "megatron-1.7b", "--gpus", "16", "--global-batch", "32", "--top", "3", "--json",
            "--schedules", "1f1b,interleaved", "--microbatch-size", "1", "--no-progress"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 3
    keys = {"tp", "pp", "dp", "schedule", "chunks", "microbatch_size", "microbatches", "zero", "recompute",
            "sequence_parallel", "step_time", "tokens_per_second", "tflops_per_gpu", "mfu", "bubble_ratio",
            "memory_per_gpu", "memory"}
    assert keys <= set(rows[0])
    assert set(rows[0]["memory"]) == {"weights", "gradients", "optimizer", "activations", "buffers"}
    assert rows[0]["memory_per_gpu"] == pytest.approx(sum(rows[0]["memory"].values()))
    assert [r["step_time"] for r in rows] == sorted(r["step_time"] for r in rows)
    assert rows[0]["tp"] * rows[0]["pp"] * rows[0]["dp"] == 16


def test_cli_explain_and_emit(capsys):
    argv = ["plan", "--model", "megatron-1.7b", "--gpus", "16", "--global-batch", "32", "--top", "2",
            "--schedules", "1f1b,interleaved", "--microbatch-size", "1", "--explain", "--emit", "torchrun",
            "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "1. Memory decides" in out and "4. Runner-up on each axis" in out
    assert "torchrun --nnodes" in out and "-m runtime --pp 2 --dp 8 --tp 1 --schedule" in out


def test_figure(tmp_path):
    from sim.plot.plan import plot_plan

    path = tmp_path / "plan.png"
    plot_plan(plan(request(top=3)), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_emitted_torchrun_names_all_three_axes():
    """--emit torchrun launches p x d x t ranks with the executor's --pp/--dp/--tp (runtime/cli.py)
    and the global batch b x m x d; what the executor lacks is said in a comment."""
    import shlex

    from runtime.cli import parser
    from sim.planner import load_model
    from sim.planner.report import torchrun_command

    space = Space(tp=(2,), pp=(2,), dp=(4,), schedules=("1f1b",), microbatch_sizes=(1,), zero=(1,),
                  recompute=("selective",), sequence_parallel=(True,))
    result = plan(PlanRequest(load_model("megatron-1.7b"), make_cluster("a100-80g", 16, 8), 32, space, top=1))
    c = result.best.config
    text = torchrun_command(result)
    comment, command = text.rsplit("\n", 1)
    argv = shlex.split(command.replace(" N ", " 0 "))
    assert int(argv[argv.index("--nnodes") + 1]) * int(argv[argv.index("--nproc-per-node") + 1]) == 16
    args = parser().parse_args(argv[argv.index("runtime") + 1:])
    assert (args.pp, args.dp, args.tp) == (c.pp, c.dp, c.tp) == (2, 4, 2)
    assert args.batch_size == c.microbatch_size * c.microbatches * c.dp == 32
    assert args.schedule == "1f1b" and args.microbatches == c.microbatches
    assert "ZeRO 1" in comment and "selective recomputation" in comment and "sequence parallelism" in comment
