"""Pipelines inside a 3D layout (runtime/layout.py): data-parallel replicas of every
registered schedule against one process on the full batch, replicas identical after
optimizer steps, a dead or silent dp peer, and bad layouts refused on every rank.

Multi-process cases run in spawned gloo groups (as tests/test_runtime_check.py does),
one group per world size, every configuration in a loop."""

import datetime
import gc
import json
import os
import subprocess
import sys
import time

import pytest
import torch
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

import schedules
from schedules.ir import Kind
from ranks import free_port, sgd_against_one_process, spawn_ranks

GROUP_TIMEOUT = 60


def _spec(model: str, num_stages: int, batch: int):
    from runtime import ModelSpec

    return ModelSpec(model=model, layers=num_stages, hidden=8, heads=2, seq_len=4, vocab=16, batch_size=batch)


def configurations(sizes: tuple[int, int, int]) -> list[dict]:
    """Every registered schedule legal at pp ranks and m = 4 (mlp; gpt under tp, which splits
    gpt only), and two gpt cases; at world size 8 three schedules only (time)."""
    pp, _, tp = sizes
    model = "gpt" if tp > 1 else "mlp"
    if pp * sizes[1] * tp == 8:
        return [{"schedule": name, "m": 4, "model": "gpt"} for name in ("1f1b", "zb-h1", "interleaved")]
    configs = [{"schedule": name, "m": 4, "model": model} for name in schedules.available() if _legal(name, pp)]
    configs += [{"schedule": "1f1b", "m": 3, "model": "gpt"}, {"schedule": "zb-h1", "m": 4, "model": "gpt"}]
    return configs


def _worker(rank, world, port, layout_sizes, configs, out):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    from runtime import RunOptions, build_model, execute
    from runtime.layout import Layout

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=GROUP_TIMEOUT))
    layout = Layout(*layout_sizes)
    results = []
    for config in configs:
        schedule = schedules.build(config["schedule"], ranks=layout.pp, microbatches=config["m"])
        program = schedules.lower(schedule, layout.dp)
        model = build_model(_spec(config["model"], schedule.num_stages, 4 * layout.dp))
        result = execute(program, model, RunOptions(steps=1, check=True, timeout=GROUP_TIMEOUT, layout=layout))
        if rank == 0:
            frame = result.timeline
            reduce = frame[frame["kind"] == "REDUCE_GRAD"]
            results.append({
                **config,
                "passed": result.passed,
                "check": result.summary["check"],
                "layout": result.summary["layout"],
                "ranks_in_timeline": sorted(set(frame["rank"])),
                "rows": len(frame),
                "expected_rows": program.num_actions,
                "reduce_stages": sorted(reduce["stage"].tolist()),
                "reduce_ordered": bool((reduce["end"] >= reduce["start"]).all()),
            })
    sgd = _replicas_after_sgd(layout)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"configs": results, "sgd": sgd}, f)
    gc.collect()
    dist.destroy_process_group()


def _replicas_after_sgd(layout) -> dict:
    """Two zb-h1 steps with SGD between and after them: every parameter against one process
    doing the same on the full batch, and against the other replicas, bit for bit."""
    import torch.distributed as dist

    from runtime import RunOptions, build_model

    program = schedules.lower(schedules.build("zb-h1", ranks=layout.pp, microbatches=3), layout.dp)
    model = build_model(_spec("gpt", program.schedule.num_stages, 3 * layout.dp))
    error, params = sgd_against_one_process(program, model, RunOptions(timeout=GROUP_TIMEOUT, layout=layout))
    # Between replicas each rank's shard is compared bit for bit.
    flat = torch.cat([(p.to_local() if isinstance(p, DTensor) else p).detach().reshape(-1) for _, p in params])
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, flat)  # stages differ in size across pipeline ranks
    here = layout.coords(dist.get_rank())
    replicas = [gathered[r] for r in layout.dp_group(dist.get_rank())]
    worst = torch.tensor(error)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    identical = torch.tensor(int(all(torch.equal(replicas[0], r) for r in replicas)))
    dist.all_reduce(identical, op=dist.ReduceOp.MIN)
    return {"max_relative_error": float(worst), "identical": bool(identical), "coords": list(here)}




@pytest.fixture(scope="module", params=[(2, 2, 1), (1, 2, 1), (1, 2, 2), (2, 2, 2)],
                ids=["pp2-dp2", "pp1-dp2", "pp1-dp2-tp2", "pp2-dp2-tp2"])
def matrix(request, tmp_path_factory):
    sizes = request.param
    world = sizes[0] * sizes[1] * sizes[2]
    configs = configurations(sizes)
    out = str(tmp_path_factory.mktemp("dp") / "results.json")
    codes = spawn_ranks(_worker, world, (world, free_port(), sizes, configs, out), timeout=300)
    assert codes == [0] * world, f"ranks exited with {codes}"
    with open(out) as f:
        data = json.load(f)
    assert len(data["configs"]) == len(configs)
    return sizes, data


def test_every_schedule_matches_one_process_on_the_full_batch(matrix):
    sizes, data = matrix
    for r in data["configs"]:
        check = r["check"]
        assert r["passed"] is True, (sizes, r)
        assert check["replicas_identical"] and check["parameters_missing"] == [], r
        assert check["max_relative_error"] <= 1e-4 and check["loss_relative_error"] <= 1e-4, r
        assert r["layout"] == {"pp": sizes[0], "dp": sizes[1], "tp": sizes[2], "mesh_dims": ["pp", "dp", "tp"],
                               "world_size": sizes[0] * sizes[1] * sizes[2]}
    names = {r["schedule"] for r in data["configs"]}
    legal = {n for n in schedules.available() if _legal(n, sizes[0])}
    assert names == legal or sizes == (2, 2, 2)


def _legal(name: str, pp: int) -> bool:
    try:
        schedules.build(name, ranks=pp, microbatches=4)
        return True
    except schedules.ScheduleError:
        return False


def test_timeline_is_one_pipeline_with_one_reduction_per_stage(matrix):
    sizes, data = matrix
    for r in data["configs"]:
        stages = schedules.build(r["schedule"], ranks=sizes[0], microbatches=r["m"]).num_stages
        assert r["ranks_in_timeline"] == list(range(sizes[0])), r
        assert r["rows"] == r["expected_rows"] and r["reduce_stages"] == list(range(stages)), r
        assert r["reduce_ordered"], r


def test_replicas_stay_identical_through_optimizer_steps(matrix):
    _, data = matrix
    assert data["sgd"]["identical"] is True
    assert data["sgd"]["max_relative_error"] < 1e-4


# ------------------------------------------------------------------ a dead or silent dp peer


def _peer_worker(rank, world, port, how, timeout, out):
    """Layout (1, 2, 1): rank 1 skips its REDUCE_GRAD and then dies or goes silent; rank 0
    must give up on its own reduction with one line naming rank, group and action."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    from runtime import PeerError, RunOptions, Session, build_model
    from runtime.layout import Layout

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout))
    layout = Layout(1, 2, 1)
    program = schedules.lower(schedules.build("1f1b", ranks=1, microbatches=2), 2)
    session = Session(program, build_model(_spec("mlp", 1, 4)), RunOptions(timeout=timeout, layout=layout))
    if rank == 1:
        session._rank.reducer.launch = lambda *args: None  # never joins the all-reduce
        session._rank.reducer.settle = lambda *args: (os._exit(0) if how == "dead" else time.sleep(timeout + 30))
        session.step()
        return
    began = time.monotonic()
    try:
        session.step()
        message = None
    except PeerError as exc:
        message = str(exc)
    with open(out, "w") as f:
        json.dump({"message": message, "seconds": time.monotonic() - began}, f)
    os._exit(0)  # the group cannot be torn down with a dead peer


@pytest.mark.parametrize("how", ["dead", "silent"])
def test_a_dead_or_silent_dp_peer_is_named_within_the_timeout(tmp_path, how):
    timeout = 3
    out = str(tmp_path / "peer.json")
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_peer_worker, args=(r, 2, port, how, timeout, out)) for r in range(2)]
    for proc in procs:
        proc.start()
    procs[0].join(timeout=120)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()
    with open(out) as f:
        data = json.load(f)
    assert data["message"] is not None and data["message"].startswith(
        "rank 0: gave up on 0REDUCE_GRAD (all-reduce on the dp group, ranks 0, 1): "
    ), data
    if how == "silent":
        assert "nothing arrived within the 3 s timeout" in data["message"]
    assert data["seconds"] < timeout + 10


# ------------------------------------------------------------------ bad layouts


def test_a_bad_layout_is_refused_on_every_rank_before_communicating(tmp_path):
    """No partner process exists for either rank: any communication would hang."""
    procs = []
    for rank in range(2):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        args = ["--schedule", "1f1b", "--microbatches", "2", "--pp", "2", "--dp", "2", "--out", str(tmp_path / "run")]
        procs.append(subprocess.Popen([sys.executable, "-m", "runtime", *args], cwd=tmp_path, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for rank, proc in enumerate(procs):
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 2, stderr
        assert stderr.strip().splitlines() == [
            f"rank {rank}: error: --pp 2 x --dp 2 x --tp 1 = 4 ranks but the world has 2 "
            "(launch pp x dp x tp processes, e.g. torchrun --nproc-per-node 4)"
        ]
    assert not (tmp_path / "run").exists()


def test_lowering_puts_one_reduction_after_each_stages_last_backward():
    """Oracle: the position of each stage's last B or W, found here from the stream."""
    for name in schedules.available():
        for p, m in ((2, 4), (4, 8)):
            try:
                schedule = schedules.build(name, ranks=p, microbatches=m)
            except schedules.ScheduleError:
                continue
            plain, reduced = schedules.lower(schedule), schedules.lower(schedule, 2)
            for rank, stream in enumerate(reduced.streams):
                assert tuple(a for a in stream if a.kind is not Kind.REDUCE_GRAD) == plain.streams[rank]
                for stage in schedule.rank_stages[rank]:
                    last = max(i for i, a in enumerate(stream) if a.stage == stage and a.kind in (Kind.B, Kind.W))
                    assert str(stream[last + 1]) == f"{stage}REDUCE_GRAD", (name, rank, stage)
            assert schedules.lower(schedule, 1) == plain


def test_validation_places_reductions_after_the_last_backward(tmp_path):
    from schedules import Program

    schedule = schedules.build("1f1b", ranks=2, microbatches=2)
    good = schedules.lower(schedule, 2)
    schedules.save_json(good, tmp_path / "p.json")
    assert schedules.load_program_json(tmp_path / "p.json") == good  # JSON keeps them
    early = list(good.streams[0])
    early.insert(0, early.pop(early.index(schedules.Action.parse("0REDUCE_GRAD"))))
    with pytest.raises(schedules.ScheduleError, match=r"\[reduce-after-backward\] rank 0, position 0"):
        schedules.validate(Program(schedule, (tuple(early), good.streams[1])))
    missing = tuple(a for a in good.streams[1] if a.kind is not Kind.REDUCE_GRAD)
    with pytest.raises(schedules.ScheduleError, match=r"\[missing-reduce\] rank 1: 1REDUCE_GRAD never runs"):
        schedules.validate(Program(schedule, (good.streams[0], missing)))


def test_calibrate_and_predict_a_data_parallel_run(tmp_path):
    """torchrun (pp, dp) = (1, 2) with profiles -> sim calibrate fits the all-reduce; the cost
    model of the run reduces each stage's parameter bytes (hand-counted) over d = 2."""
    from sim.calibration import calibrate
    from sim.measured import read_measured

    out = tmp_path / "run"
    port = free_port()
    cmd = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--nproc-per-node", "2", "--master-addr",
           "127.0.0.1", "--master-port", str(port), "-m", "runtime", "--schedule", "gpipe", "--microbatches", "2",
           "--dp", "2", "--layers", "4", "--hidden", "16", "--batch-size", "8", "--steps", "3", "--warmup", "1",
           "--profile-layers", "--profile-p2p", "--timeout", "60", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = read_measured(out)
    assert run.summary["layout"]["dp"] == 2 and run.rows == 2  # 8 samples / 2 replicas / 2 microbatches
    calibration = calibrate(run)
    assert calibration.data_parallel == 2 and calibration.allreduce_latency > 0
    assert 0 < calibration.allreduce_bandwidth < float("inf")
    costs = calibration.for_run(run)
    assert costs.data_parallel == 2 and costs.grad_reduce_bytes == (4 * (16 * 16 + 16) * 4,)  # 4 Linear(16, 16), fp32
    compare = subprocess.run([sys.executable, "-m", "sim", "compare", "--measured", str(out), "--json"], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=120)
    assert compare.returncode == 0, compare.stderr
    assert json.loads(compare.stdout)["step_time_simulated"] > 0


def test_gradients_travel_in_buckets_from_the_last_parameter_back():
    """DDP's bucketing: reverse order, at most `cap` bytes each, an oversized tensor alone."""
    from torch import nn

    from runtime.data_parallel import buckets

    p10, p20, p30 = (nn.Parameter(torch.zeros(n)) for n in (10, 20, 30))  # 40, 80, 120 bytes
    assert buckets([p10, p20, p30], cap=128) == [[p30], [p20, p10]]
    assert buckets([p10, p20, p30], cap=100) == [[p30], [p20], [p10]]
    assert buckets([p10, p20, p30]) == [[p30, p20, p10]]
