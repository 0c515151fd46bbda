"""CSV and JSON round trips, schedules written by torch.distributed.pipelining, malformed files."""

from types import SimpleNamespace

import pytest

import schedules
from schedules import Program, ScheduleError, build, lower


@pytest.mark.parametrize("name, p, m, v", [("gpipe", 3, 4, None), ("1f1b", 4, 6, None), ("interleaved", 2, 4, 3)])
def test_csv_round_trip(tmp_path, name, p, m, v):
    schedule = build(name, ranks=p, microbatches=m, chunks=v)
    schedules.save_csv(schedule, tmp_path / "s.csv")
    loaded = schedules.load_csv(tmp_path / "s.csv")
    assert (loaded.ranks, loaded.microbatches, loaded.chunks) == (p, m, v or 1)
    assert loaded.order == schedule.order and loaded.stage_to_rank == schedule.stage_to_rank
    program = lower(schedule)
    schedules.save_csv(program, tmp_path / "p.csv")
    assert schedules.load_program_csv(tmp_path / "p.csv").streams == program.streams
    # A file with communication loads as a Schedule too (transfers dropped).
    assert schedules.load_csv(tmp_path / "p.csv").order == schedule.order


def test_json_round_trip(tmp_path):
    schedule = build("interleaved", ranks=4, microbatches=8, chunks=2)
    schedules.save_json(schedule, tmp_path / "s.json")
    assert schedules.load_json(tmp_path / "s.json") == schedule
    program = lower(schedule)
    schedules.save_json(program, tmp_path / "p.json")
    loaded = schedules.load_json(tmp_path / "p.json")
    assert isinstance(loaded, Program) and loaded.streams == program.streams
    assert schedules.load_program_json(tmp_path / "s.json").streams == program.streams


def _torch_stages(p, v, rank, vshape=False):
    import torch

    n = p * v
    held = [rank, 2 * p - 1 - rank] if vshape else [rank + c * p for c in range(v)]
    return [
        SimpleNamespace(num_stages=n, group_size=p, group_rank=rank, stage_index=i, is_first=i == 0,
                        is_last=i == n - 1, stage_index_to_group_rank=None, submod=torch.nn.Linear(1, 1))
        for i in held
    ]


@pytest.mark.parametrize("cls_name, vshape", [
    ("ScheduleInterleaved1F1B", False),
    ("ScheduleLoopedBFS", False),
    ("ScheduleInterleavedZeroBubble", False),
    ("ScheduleZBVZeroBubble", True),
])
def test_torch_dumped_csv_loads_validates_and_lowers(tmp_path, cls_name, vshape):
    # Schedules written by torch.distributed.pipelining itself: an independent source of the format.
    from torch.distributed.pipelining import schedules as torch_schedules

    cls = getattr(torch_schedules, cls_name)
    torch_schedule = cls(_torch_stages(4, 2, 0, vshape), 8, loss_fn=lambda out, target: out)
    torch_schedule._dump_csv(str(tmp_path / "compute.csv"), format="compute_only")
    torch_schedule._dump_csv(str(tmp_path / "comms.csv"), format="compute_comms")
    loaded = schedules.load_csv(tmp_path / "compute.csv")
    assert (loaded.ranks, loaded.microbatches, loaded.chunks) == (4, 8, 2)
    assert loaded.placement == ("v" if vshape else "looped")
    lower(loaded)
    program = schedules.load_program_csv(tmp_path / "comms.csv")
    assert program.schedule.order == loaded.order


def _torch_runtime(schedule, path, fmt):
    """torch.distributed.pipelining's own reader (_PipelineScheduleRuntime._load_csv) on rank 0's view."""
    from torch.distributed.pipelining import schedules as torch_schedules

    stages = _torch_stages(schedule.ranks, schedule.chunks, 0, vshape=schedule.placement == "v")
    runtime = torch_schedules._PipelineScheduleRuntime(stages, schedule.microbatches, loss_fn=lambda out, target: out)
    runtime._load_csv(str(path), format=fmt)
    return runtime


@pytest.mark.parametrize("name", schedules.available())
def test_our_csv_files_load_in_torch(tmp_path, name):
    """What we write, torch reads: the compute-only file gives torch our order and our
    placement (which torch infers from the rows), the file with communication gives torch
    our streams action for action, and torch's own simulator of such streams runs them to
    the end (it stops with "not progressing" on a deadlock)."""
    schedule = build(name, ranks=4, microbatches=8)
    program = lower(schedule)
    schedules.save_csv(schedule, tmp_path / "compute.csv")
    schedules.save_csv(program, tmp_path / "comms.csv")
    compute = _torch_runtime(schedule, tmp_path / "compute.csv", "compute_only")
    assert {r: [str(a) for a in row] for r, row in compute.pipeline_order.items()} == {
        r: [str(a) for a in row] for r, row in enumerate(schedule.order)}
    assert compute.stage_index_to_group_rank == dict(enumerate(schedule.stage_to_rank))
    comms = _torch_runtime(schedule, tmp_path / "comms.csv", "compute_comms")
    assert {r: [str(a) for a in row] for r, row in comms.pipeline_order_with_comms.items()} == {
        r: [str(a) for a in row] for r, row in enumerate(program.streams)}
    comms._simulate()


def test_torchs_simulator_rejects_a_deadlocked_csv(tmp_path):
    """The check above can fail: a receive posted before the sends its peer waits for."""
    schedule = build("1f1b", ranks=2, microbatches=2)
    program = lower(schedule)
    streams = [list(s) for s in program.streams]
    early = streams[0].pop([str(a) for a in streams[0]].index("0RECV_B1"))
    streams[0].insert(0, early)
    (tmp_path / "bad.csv").write_text("\n".join(",".join(map(str, s)) for s in streams) + "\n")
    # torch 2.13 stops there, but its report of it ("Schedule is not progressing") fails first,
    # formatting the partial schedule (IndexError in _format_pipeline_order).
    with pytest.raises((ValueError, IndexError)) as info:
        _torch_runtime(schedule, tmp_path / "bad.csv", "compute_comms")._simulate()
    assert any(frame.name == "_simulate_comms_compute" for frame in info.traceback)


@pytest.mark.parametrize("content, message", [
    ("0F0,0X0\n", r"row 1, cell 2: cannot parse action '0X0'"),
    ("0F0,0B0\n1F0,1B0\n2F0\n", r"\[missing-backward\]"),
    ("0F0,1F0\n1B0,0B0\n", r"\[placement\] .*stage 1 has compute actions on ranks 0 and 1"),
    ("\n\n", r"holds no schedule rows"),
    ("0F0,0B0,2F0,2B0\n1F0,1B0\n", r"3 stages cannot be spread evenly over 2 ranks"),
])
def test_malformed_csv(tmp_path, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(ScheduleError, match=message):
        schedules.load_csv(path)


def test_missing_file_and_bad_json(tmp_path):
    with pytest.raises(ScheduleError, match="cannot read schedule file"):
        schedules.load_csv(tmp_path / "none.csv")
    (tmp_path / "b.json").write_text("{")
    with pytest.raises(ScheduleError, match="is not valid JSON"):
        schedules.load_json(tmp_path / "b.json")
    (tmp_path / "c.json").write_text('{"format": "bubblescope-schedule", "ranks": "two"}')
    with pytest.raises(ScheduleError, match="field 'stage_to_rank' must be list"):
        schedules.load_json(tmp_path / "c.json")


def test_grid_view_shows_the_pipeline():
    text = schedules.grid(build("1f1b", ranks=2, microbatches=2))
    lines = text.splitlines()
    assert lines[0] == "1f1b (p=2, m=2, v=1, looped placement)"
    assert lines[2].split() == ["0", "0F0", "."]
    assert lines[3].split() == ["1", "0F1", "1F0"]
    assert lines[4].split() == ["2", ".", "1B0"]
