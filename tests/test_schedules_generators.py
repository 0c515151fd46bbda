"""Generators: hand-checked orders, a validity grid, and exact in-flight counts."""

import pytest

import schedules
from schedules import ScheduleError, build, lower, peak_in_flight


def rows(schedule):
    return [" ".join(str(a) for a in row) for row in schedule.order]


def test_gpipe_by_hand():
    s = build("gpipe", ranks=2, microbatches=3)
    assert rows(s) == ["0F0 0F1 0F2 0B0 0B1 0B2", "1F0 1F1 1F2 1B0 1B1 1B2"]
    assert s.stage_to_rank == (0, 1)


def test_1f1b_by_hand_p2_m4():
    s = build("1f1b", ranks=2, microbatches=4)
    assert rows(s) == [
        "0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3",
        "1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3",
    ]


def test_1f1b_by_hand_p4_m8():
    s = build("1f1b", ranks=4, microbatches=8)
    assert rows(s)[0] == "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7"
    assert rows(s)[1] == "1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1F6 1B4 1F7 1B5 1B6 1B7"
    assert rows(s)[3] == "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7"


def test_1f1b_fewer_microbatches_than_ranks():
    s = build("1f1b", ranks=4, microbatches=2)
    assert rows(s) == ["0F0 0F1 0B0 0B1", "1F0 1F1 1B0 1B1", "2F0 2F1 2B0 2B1", "3F0 3B0 3F1 3B1"]


def test_interleaved_by_hand_p2_m4_v2():
    # Megatron-LM order: groups of p microbatches go through chunk 0, then chunk 1;
    # backward mirrors the chunks; rank r warms up with (p-r-1)*2 + (v-1)*p forwards.
    s = build("interleaved", ranks=2, microbatches=4, chunks=2)
    assert s.stage_to_rank == (0, 1, 0, 1)
    assert rows(s) == [
        "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3",
    ]


def test_interleaved_rejects_m_not_multiple_of_group_and_says_which_m():
    with pytest.raises(ScheduleError, match=r"allowed m: multiples of the group size 4 \(4, 8, 12"):
        build("interleaved", ranks=4, microbatches=6, chunks=2)
    with pytest.raises(ScheduleError, match="group_size >= ranks"):
        build("interleaved", ranks=4, microbatches=8, chunks=2, group_size=2)


def test_interleaved_group_size_option():
    s = build("interleaved", ranks=2, microbatches=6, chunks=2, group_size=3)
    assert rows(s)[1].startswith("1F0 1F1 1F2 3F0")


def test_fixed_chunk_schedules_refuse_other_chunks():
    with pytest.raises(ScheduleError, match="1f1b runs 1 stage"):
        build("1f1b", ranks=2, microbatches=2, chunks=2)
    with pytest.raises(ScheduleError, match="needs chunks >= 2"):
        build("interleaved", ranks=2, microbatches=2, chunks=1)


def test_unknown_schedule_and_bad_sizes():
    with pytest.raises(ScheduleError, match="unknown schedule 'nope'; available: gpipe, 1f1b, interleaved"):
        build("nope", ranks=2, microbatches=2)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ScheduleError, match="ranks must be a positive integer"):
            build("gpipe", ranks=bad, microbatches=2)


def _legal(name, p, m, v):
    try:
        return build(name, ranks=p, microbatches=m, chunks=v)
    except ScheduleError:
        return None


@pytest.mark.parametrize("p", range(1, 9))
def test_grid_validates_and_lowers(p):
    for name in ("gpipe", "1f1b", "interleaved"):
        chunk_values = (None,) if schedules.generator(name).chunks is not None else (2, 3, 4)
        built = 0
        for v in chunk_values:
            for m in range(1, 4 * p + 1):
                s = _legal(name, p, m, v)
                if s is None:
                    assert name == "interleaved" and m % p, (name, p, m, v)
                    continue
                built += 1
                program = lower(s)
                assert [tuple(a for a in st if a.kind.is_compute) for st in program.streams] == list(s.order)
                # Every action of each (stage, microbatch) exists exactly once.
                assert sum(len(r) for r in s.order) == 2 * s.num_stages * m
        assert built > 0


@pytest.mark.parametrize("p", range(1, 9))
def test_in_flight_closed_forms(p):
    for m in range(1, 4 * p + 1):
        assert peak_in_flight(build("gpipe", ranks=p, microbatches=m)) == [m] * p
        assert peak_in_flight(build("1f1b", ranks=p, microbatches=m)) == [min(p - r, m) for r in range(p)]
        if m % p == 0:
            for v in (2, 3, 4):
                peak = peak_in_flight(build("interleaved", ranks=p, microbatches=m, chunks=v))
                assert peak[0] == min(p * v + p - 1, m * v)


def test_lowering_inserts_transfers_only_across_ranks():
    program = lower(build("interleaved", ranks=2, microbatches=2, chunks=2))
    text = [" ".join(str(a) for a in st) for st in program.streams]
    # stage 0 -> 1 crosses ranks (SEND after the producer, RECV right before the consumer);
    # the last stage (3) sends nothing forward and receives no gradient.
    assert text[0].startswith("0F0 0SEND_F0 0F1 0SEND_F1 2RECV_F0 2F0 2SEND_F0")
    assert "3SEND_F" not in text[1] and "3RECV_B" not in text[1]
    assert "0SEND_B" not in text[0]


def test_single_rank_program_has_no_transfers():
    program = lower(build("interleaved", ranks=1, microbatches=3, chunks=3))
    assert all(a.kind.is_compute for a in program.streams[0])
