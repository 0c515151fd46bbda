"""--check across the schedule matrix: one spawned gloo process group per world size runs
every configuration in a loop through `runtime.execute`, and each configuration's
gradients and loss must equal the single-process reference; its timeline must hold
exactly one row per action of the program per step."""

import datetime
import gc
import json
import os
from collections import Counter

import pytest
import torch
from torch import nn

import schedules
from schedules.posting import posting_plan
from schedules import Schedule
from schedules.ir import B, F
from ranks import free_port, spawn_ranks

GROUP_TIMEOUT = 60  # seconds; a broken configuration fails instead of hanging the suite


def swapped_schedule() -> Schedule:
    """Rank 1 consumes microbatch 1 before 0, in both directions: receives out of send order."""
    order = (
        (F(0, 0), F(0, 1), B(0, 0), B(0, 1)),
        (F(1, 1), F(1, 0), B(1, 1), B(1, 0)),
    )
    return Schedule("swapped", 2, 2, 1, (0, 1), order)


def test_posting_plan_posts_in_the_senders_order():
    program = schedules.lower(swapped_schedule())
    assert [str(a) for a in program.streams[1][:3]] == ["1RECV_F1", "1F1", "1RECV_F0"]
    assert posting_plan(program, 1) == {0: ((0, 0, 0), (0, 0, 1)), 2: ()}
    assert [str(a) for a in program.streams[0][4:7]] == ["0RECV_B0", "0B0", "0RECV_B1"]
    assert posting_plan(program, 0) == {4: ((1, 1, 1), (1, 1, 0)), 6: ()}
    for name in schedules.available():
        program = schedules.lower(schedules.build(name, ranks=4, microbatches=8))
        for rank in range(4):
            _check_plan(program, rank)
    # On the V placement, rank 0 -> 1 carries activations and gradients, received in
    # another order than sent: there the plan must post ahead.
    zbv = schedules.lower(schedules.build("zbv", ranks=4, microbatches=8))
    assert any(len(keys) > 1 for keys in posting_plan(zbv, 1).values())


def _check_plan(program, rank):
    """Every receive posted once, no later than its RECV, and per sender in SEND order."""
    s2r = program.schedule.stage_to_rank
    stream = program.streams[rank]
    plan = posting_plan(program, rank)
    assert sorted(plan) == [i for i, a in enumerate(stream) if a.kind.is_recv]
    posted_at = {}
    for pos, keys in plan.items():
        for j, key in enumerate(keys):
            assert key not in posted_at
            posted_at[key] = (pos, j)
    for pos, action in enumerate(stream):
        if action.kind.is_recv:
            send = action.matching()
            key = (0 if action.kind.name == "RECV_F" else 1, send.stage, send.microbatch)
            assert posted_at[key][0] <= pos
    for src, sender in enumerate(program.streams):
        sent = [
            (0 if a.kind.name == "SEND_F" else 1, a.stage, a.microbatch)
            for a in sender
            if a.kind.is_send and s2r[a.peer_stage()] == rank
        ]
        assert sorted(sent, key=lambda k: posted_at[k]) == sent


def configurations(p: int) -> list[dict]:
    """gpipe/1f1b/interleaved and every registered schedule, m in {1, p, 2p+1} where legal."""
    configs = []
    for name in schedules.available():
        for m in sorted({1, p, 2 * p + 1}):
            try:
                schedules.build(name, ranks=p, microbatches=m)
            except schedules.ScheduleError:
                continue
            for model in ("mlp", "gpt"):
                configs.append({"schedule": name, "m": m, "model": model})
    if p == 2:
        configs += [
            {"schedule": "interleaved", "m": 4, "chunks": 3, "model": "gpt", "steps": 2},
            {"schedule": "1f1b", "m": 4, "model": "user"},
            {"schedule": "zb-h1", "m": 4, "model": "user"},
            {"schedule": "swapped", "m": 2, "model": "mlp", "transport": "tagged"},
            {"schedule": "swapped", "m": 2, "model": "gpt", "transport": "ordered"},
            {"schedule": "zbv", "m": 4, "model": "gpt", "transport": "ordered", "steps": 2},
            {"schedule": "interleaved", "m": 4, "model": "gpt", "post_ahead": 1},
            {"schedule": "zbv", "m": 5, "model": "mlp", "post_ahead": 2, "transport": "ordered"},
            {"schedule": "interleaved", "m": 4, "model": "mlp", "post_ahead": "step"},
            {"schedule": "zbv", "m": 4, "model": "mlp", "post_ahead": "step", "transport": "ordered"},
            {"schedule": "zb-h2", "m": 5, "model": "gpt", "post_ahead": "auto"},
        ]
    elif p == 1:  # one rank, several stages: what a single GPU can run (batch 3)
        configs += [
            {"schedule": "interleaved", "m": 3, "chunks": 3, "model": "gpt", "steps": 2},
            {"schedule": "looped-bfs", "m": 3, "chunks": 3, "model": "mlp"},
        ]
    else:
        configs += [
            {"schedule": "1f1b", "m": 9, "model": "gpt", "post_ahead": 1},
            {"schedule": "zbv", "m": 8, "model": "gpt", "post_ahead": 1, "transport": "ordered"},
            {"schedule": "interleaved", "m": 8, "model": "mlp", "post_ahead": "step"},
        ]
    configs.append({"schedule": "1f1b", "m": 3, "model": "sum-loss"})
    return configs


def _program(config: dict, p: int):
    if config["schedule"] == "swapped":
        return schedules.lower(swapped_schedule())
    schedule = schedules.build(config["schedule"], ranks=p, microbatches=config["m"], chunks=config.get("chunks"))
    return schedules.lower(schedule)


def _model(config: dict, num_stages: int, batch: int):
    from runtime import ModelSpec, build_model, from_layers

    if config["model"] in ("user", "sum-loss"):
        torch.manual_seed(3)
        layers = nn.Sequential(*(nn.Sequential(nn.Linear(6, 6), nn.Tanh()) for _ in range(num_stages)))
        data = torch.Generator().manual_seed(4)
        inputs, targets = torch.randn(batch, 6, generator=data), torch.randn(batch, 6, generator=data)
        if config["model"] == "sum-loss":
            # A sum-reduced loss breaks the mean-loss contract: --check must catch the mismatch.
            return from_layers(layers, lambda y, t: ((y - t) ** 2).sum(), inputs, targets)
        return from_layers(layers, nn.functional.mse_loss, inputs, targets)
    spec = ModelSpec(model=config["model"], layers=num_stages, hidden=16, heads=2, seq_len=4, vocab=32, batch_size=batch)
    return build_model(spec)


def _worker(rank: int, world: int, port: int, configs: list[dict], out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    from runtime import RunOptions, execute

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=GROUP_TIMEOUT))
    results = []
    for config in configs:
        program = _program(config, world)
        model = _model(config, program.schedule.num_stages, 2 * world + 1)
        steps = config.get("steps", 1)
        options = RunOptions(
            steps=steps, check=True, timeout=GROUP_TIMEOUT, transport=config.get("transport"),
            post_ahead=config.get("post_ahead", 0),
        )
        result = execute(program, model, options)
        if rank == 0:
            frame = result.timeline
            expected = Counter(
                (step, r, str(a)) for step in range(steps) for r, stream in enumerate(program.streams) for a in stream
            )
            got = Counter(zip(frame["step"], frame["rank"], frame["action"]))
            sends = frame[frame["kind"].str.startswith("SEND")]
            results.append(
                {
                    **config,
                    "passed": result.passed,
                    "check": result.summary["check"],
                    "rows": len(frame),
                    "expected_rows": program.num_actions * steps,
                    "rows_match": got == expected,
                    "ordered_in_time": bool((frame["end"] >= frame["start"]).all()),
                    "sends_end_at_delivery": bool((sends["end"] >= sends["start"]).all()),
                    "memory_rows": len(result.memory),
                    "peaks": result.summary["peak_activation_bytes"],
                    "stage_costs": result.summary["stage_costs"],
                }
            )
    sgd_error = _session_with_sgd(world)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"configs": results, "session_sgd_error": sgd_error}, f)
    # Free objects in reference cycles while the interpreter is whole: a process group they
    # keep alive would otherwise be torn down at exit, where gloo's threads abort (SIGABRT).
    gc.collect()
    dist.destroy_process_group()


def _session_with_sgd(world: int) -> float:
    """Two steps of zb-h1 through a Session with SGD between them, against one process doing
    the same; returns the largest relative gradient error of the second step over all ranks."""
    import copy

    import torch.distributed as dist

    from runtime import RunOptions, Session
    from runtime.reference import relative_error

    program = schedules.lower(schedules.build("zb-h1", ranks=world, microbatches=world + 1))
    model = _model({"model": "gpt"}, program.schedule.num_stages, 2 * world + 1)
    full = copy.deepcopy(model.full_module())  # before the session patches any forward
    optimizer = torch.optim.SGD(full.parameters(), lr=0.5)
    for _ in range(2):
        optimizer.zero_grad()
        model.loss(full(model.inputs), model.targets).backward()
        if _ == 0:
            optimizer.step()
    expected = dict(full.named_parameters())
    with Session(program, model, RunOptions(timeout=GROUP_TIMEOUT)) as session:
        session.step()
        local = torch.optim.SGD([p for _, p in session.named_parameters()], lr=0.5)
        local.step()
        session.step()
        errors = [relative_error(p.grad, expected[name].grad) for name, p in session.named_parameters()]
        session.finish()
    worst = torch.tensor(max(errors))
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return float(worst)


def _run_group(world: int, configs: list[dict], out: str) -> list[dict]:
    codes = spawn_ranks(_worker, world, (world, free_port(), configs, out), timeout=600)
    assert codes == [0] * world, f"ranks exited with {codes}"
    with open(out) as f:
        return json.load(f)


@pytest.fixture(scope="module", params=[1, 2, 4], ids=["p1", "p2", "p4"])
def matrix(request, tmp_path_factory):
    p = request.param
    configs = configurations(p)
    data = _run_group(p, configs, str(tmp_path_factory.mktemp(f"matrix{p}") / "results.json"))
    assert len(data["configs"]) == len(configs)
    return p, data["configs"], data["session_sgd_error"]


def test_every_configuration_matches_the_reference(matrix):
    p, results, _ = matrix
    failed = [
        (r["schedule"], r["m"], r["model"], r["check"]["max_relative_error"], r["check"]["loss_relative_error"])
        for r in results
        if r["model"] != "sum-loss" and not r["passed"]
    ]
    assert not failed, f"p={p}: --check failed for {failed}"
    for r in results:
        if r["model"] != "sum-loss":
            assert r["check"]["parameters_missing"] == [] and r["check"]["max_relative_error"] <= 1e-4


def test_matrix_covers_the_required_schedules(matrix):
    p, results, _ = matrix
    seen = {(r["schedule"], r["m"], r["model"]) for r in results}
    for model in ("mlp", "gpt"):
        for m in (1, p, 2 * p + 1):
            assert ("gpipe", m, model) in seen and ("1f1b", m, model) in seen
        assert ("interleaved", p, model) in seen  # m = 1 and 2p+1 are illegal for interleaved
        for name in schedules.available():
            assert any(r[0] == name and r[2] == model for r in seen), name


def test_timeline_has_exactly_one_row_per_action_per_step(matrix):
    _, results, _ = matrix
    for r in results:
        assert r["rows"] == r["expected_rows"] and r["rows_match"], r
        assert r["ordered_in_time"] and r["sends_end_at_delivery"], r
        assert r["memory_rows"] > 0 and all(peak >= 0 for peak in r["peaks"])


def test_check_catches_a_loss_that_breaks_the_mean_contract(matrix):
    _, results, _ = matrix
    (bad,) = [r for r in results if r["model"] == "sum-loss"]
    assert bad["passed"] is False and bad["check"]["max_relative_error"] > 0.1


def _held(order, activation, kept) -> int:
    """Peak saved bytes of one rank walking `order`: F saves its stage's activation, B frees
    it, I trades it for what W keeps (input and output gradient of each Linear), W frees that."""
    held = peak = 0
    for a in order:
        kind = a.kind.value
        held += {"F": activation[a.stage], "B": -activation[a.stage],
                 "I": (kept[a.stage] or 0) - activation[a.stage], "W": -(kept[a.stage] or 0)}[kind]
        peak = max(peak, held)
    return peak


def _in_flight(order, last: str) -> int:
    """Most microbatches of one rank between their F and their `last` kind (B, or W)."""
    open_, most = set(), 0
    for a in order:
        if a.kind.value == "F":
            open_.add((a.stage, a.microbatch))
        elif a.kind.value == last:
            open_.discard((a.stage, a.microbatch))
        most = max(most, len(open_))
    return most


def test_split_backward_holds_what_its_order_says_against_1f1b(matrix):
    """1F1B's measured peak is its closed form, min(p - r, m) activations of rank r's stage;
    ZB-H1 keeps 1F1B's largest in-flight count (p microbatches on rank 0, from F until W) and
    its measured peak is exactly its order walked with the run's per-stage bytes: its W-only
    leftovers cost what they keep (on these models more than the activation: a Linear's
    input and its output gradient), not a whole microbatch more each."""
    p, results, _ = matrix
    m = 2 * p + 1
    by = {(r["schedule"], r["m"], r["model"]): r for r in results}
    one_order = schedules.build("1f1b", ranks=p, microbatches=m).order
    h1_order = schedules.build("zb-h1", ranks=p, microbatches=m).order
    assert max(_in_flight(o, "W") for o in h1_order) == max(_in_flight(o, "B") for o in one_order) == p
    for model in ("mlp", "gpt"):
        one, h1 = by[("1f1b", m, model)], by[("zb-h1", m, model)]
        activation = [c["activation_bytes"] for c in one["stage_costs"]]
        assert one["peaks"] == [min(p - r, m) * activation[r] for r in range(p)], (model, one["peaks"])
        h1_activation = [c["activation_bytes"] for c in h1["stage_costs"]]
        assert h1_activation == activation  # F saves the same whichever backward follows
        kept = [c["weight_grad_bytes"] for c in h1["stage_costs"]]
        assert h1["peaks"] == [_held(h1_order[r], activation, kept) for r in range(p)], (model, h1["peaks"])
        gpipe = by[("gpipe", m, model)]["peaks"]
        assert max(h1["peaks"]) < max(gpipe), (model, h1["peaks"], gpipe)


def test_a_session_steps_with_an_optimizer_between_steps(matrix):
    """Gradients of the second step, after SGD on each rank's own parameters, equal those
    of one process doing the same two steps."""
    _, _, error = matrix
    assert error < 1e-4
