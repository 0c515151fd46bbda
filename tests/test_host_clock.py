"""Ranks of one host on one clock (runtime.clock, runtime.record): offsets taken from the host's
monotonic clock put every rank's rows on the earliest rank's step start, and a real run's rows
then keep causality across ranks (nothing starts before what it needs has ended)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from runtime.clock import host_clock_id
from runtime.record import host_clock_offsets, on_host_clock
from schedules.timeline import memory_frame, timeline_frame
from ranks import free_port, rank_env

TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def payload(rank: int, origins: list[int | None], clock: str | None = "host-a/boot-1") -> dict:
    return {"rank": rank, "origins": origins, "clock_id": clock}


def test_offsets_count_from_the_earliest_rank_of_each_step():
    payloads = [payload(0, [5_000_000, 9_000_000]), payload(1, [3_500_000, 9_250_000]), payload(2, [4_000_000, 12_000_000])]
    offsets = host_clock_offsets(payloads)
    assert offsets == [{0: 0.0015, 1: 0.0, 2: 0.0005}, {0: 0.0, 1: 0.00025, 2: 0.003}]


@pytest.mark.parametrize("payloads", [
    [payload(0, [1, 2]), payload(1, [1, 2], "host-b/boot-1")],  # two hosts: two clocks
    [payload(0, [1, 2], None), payload(1, [1, 2], None)],  # a platform that does not name its boot
    [payload(0, [None, None]), payload(1, [None, None])],  # CUDA events: no host time
    [payload(0, [1, 2]), payload(1, [1])],  # step counts that disagree
    [{"rank": 0}, {"rank": 1}],  # payloads from before the field
])
def test_without_one_host_clock_the_rank_clocks_stay(payloads):
    assert host_clock_offsets(payloads) is None


def test_rows_move_by_their_rank_and_step_offset():
    timeline = timeline_frame([
        (0, 0, 0, 0, 0, "F", "0F0", 0.0, 1.0, -1, "measured"),
        (0, 1, 1, 0, 0, "F", "1F0", 1.25, 2.0, -1, "measured"),
        (1, 1, 1, 0, 0, "F", "1F0", 1.25, 2.0, -1, "measured"),
    ])
    memory = memory_frame([(0, 0, 0.0, 0, "measured"), (0, 1, 2.0, 8, "measured"), (1, 1, 0.0, 0, "measured")])
    on_host_clock(timeline, memory, [{0: 0.0, 1: 0.5}, {0: 0.25, 1: 0.0}])
    assert timeline[["start", "end"]].values.tolist() == [[0.0, 1.0], [1.75, 2.5], [1.25, 2.0]]
    assert memory["time"].tolist() == [0.0, 2.5, 0.0]


def test_this_host_names_its_clock():
    """Linux names the boot whose CLOCK_MONOTONIC every process reads (the CI machines are Linux)."""
    clock = host_clock_id()
    assert clock is not None and clock == host_clock_id() and "/" in clock


def test_a_real_run_of_four_ranks_on_shared_cores_keeps_causality(tmp_path):
    """Four ranks on this machine's cores leave a step's barrier up to milliseconds apart (1-3 ms
    measured at p=4 on two cores, README), so on each rank's own clock a fifth of the cross-rank
    dependencies of a 1F1B run started before what they consume had ended. On the host clock a
    forward starts after the previous stage's forward of its microbatch, a backward after the
    next stage's backward, and a RECV ends no earlier than its SEND started."""
    out = tmp_path / "run"
    cmd = [TORCHRUN, "--nproc-per-node", "4", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "runtime", "--schedule", "1f1b", "--microbatches", "8", "--layers", "4", "--hidden", "64",
           "--batch-size", "32", "--steps", "8", "--warmup", "1", "--timeout", "60", "--out", str(out)]
    done = subprocess.run(cmd, env=rank_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["clocks"] == "host"
    # each rank's step start on the clock: the earliest at 0, and where its memory rows begin
    starts = summary["rank_step_starts"]
    assert len(starts) == 8 and all(len(s) == 4 and min(s) == 0.0 for s in starts)
    memory = pd.read_csv(out / "memory.csv").groupby(["step", "rank"])["time"].min()
    assert [memory[(k, r)] for k in range(8) for r in range(4)] == pytest.approx(sum(starts, []), abs=1e-9)
    timeline = pd.read_csv(out / "timeline.csv")
    key = ["step", "stage", "microbatch"]
    pairs = 0
    for kind, later in (("F", 1), ("B", -1)):
        rows = timeline[timeline["kind"] == kind]
        before = rows.assign(stage=rows["stage"] + later)[key + ["end"]]
        after = rows[key + ["start"]].merge(before, on=key)
        assert (after["start"] >= after["end"]).all(), after[after["start"] < after["end"]]
        pairs += len(after)
    assert pairs == 2 * 8 * 3 * 8  # both kinds, 3 stage boundaries, 8 microbatches, 8 steps
    for way, later in (("F", 1), ("B", -1)):  # sSEND_Fj is received as (s+1)RECV_Fj, sSEND_Bj as (s-1)RECV_Bj
        sends = timeline[timeline["kind"] == f"SEND_{way}"]
        recvs = timeline[timeline["kind"] == f"RECV_{way}"]
        matched = sends.assign(stage=sends["stage"] + later).merge(recvs, on=key, suffixes=("_send", "_recv"))
        assert len(matched) == len(sends) == 8 * 3 * 8
        assert (matched["end_recv"] >= matched["start_send"]).all()
