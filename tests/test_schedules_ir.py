import pytest
from hypothesis import given, strategies as st

from schedules import Action, Kind, ScheduleError


@pytest.mark.parametrize(
    "text, action",
    [
        ("0F1", Action(0, Kind.F, 1)),
        ("3B0", Action(3, Kind.B, 0)),
        ("2I1", Action(2, Kind.I, 1)),
        ("1W4", Action(1, Kind.W, 4)),
        ("2SEND_B3", Action(2, Kind.SEND_B, 3)),
        ("12RECV_F105", Action(12, Kind.RECV_F, 105)),
        ("1REDUCE_GRAD", Action(1, Kind.REDUCE_GRAD, -1)),  # torch's form: no microbatch
    ],
)
def test_parse_and_print(text, action):
    assert Action.parse(text) == action
    assert str(action) == text


@given(st.integers(0, 10_000), st.sampled_from([k for k in Kind if not k.is_collective]), st.integers(0, 10_000))
def test_round_trip(stage, kind, microbatch):
    action = Action(stage, kind, microbatch)
    assert Action.parse(str(action)) == action


@pytest.mark.parametrize(
    "bad", ["", "F1", "0F", "0X1", "0SEND1", "-1F0", "0F1x", "0 F 1", "0f1", "1REDUCE_GRAD0", "REDUCE_GRAD"]
)
def test_parse_rejects(bad):
    with pytest.raises(ScheduleError, match="cannot parse action"):
        Action.parse(bad)


def test_matching_pairs_follow_torch_convention():
    assert Action.parse("1SEND_F0").matching() == Action.parse("2RECV_F0")
    assert Action.parse("2SEND_B0").matching() == Action.parse("1RECV_B0")
    assert Action.parse("2RECV_F0").matching() == Action.parse("1SEND_F0")
    assert Action.parse("1RECV_B0").matching() == Action.parse("2SEND_B0")
    with pytest.raises(ValueError, match="0F0 is not a SEND or RECV"):
        Action.parse("0F0").matching()


def test_peer_stage_is_the_other_end():
    assert [Action.parse(a).peer_stage() for a in ("1SEND_F0", "2RECV_F0", "2SEND_B0", "1RECV_B0")] == [2, 1, 1, 2]
    assert Action.parse("1F0").peer_stage() is None


def test_parse_error_shows_the_accepted_forms():
    with pytest.raises(ScheduleError) as info:
        Action.parse("0X1")
    assert str(info.value).startswith("cannot parse action '0X1': expected STAGE KIND MICROBATCH such as "
                                      "'0F1', '3B0', '2I1', '1W4' or '2SEND_B3'")


def test_a_send_and_its_recv_name_one_transfer_numbered_densely():
    """Every cross-stage transfer of a 4-stage, 3-microbatch pipeline: its SEND and RECV give
    the same Transfer, the torch text form of both ends follows, and the numbers are distinct
    and below transfer_count (the simulator indexes by them, the executor tags with them)."""
    from schedules.ir import Direction, transfer_count

    n, m = 4, 3
    numbers = set()
    for mb in range(m):
        for stage in range(n - 1):  # forward: stage -> stage + 1
            send, recv = Action.parse(f"{stage}SEND_F{mb}"), Action.parse(f"{stage + 1}RECV_F{mb}")
            assert send.transfer == recv.transfer == (Direction.FORWARD, stage, mb)
            assert (send.transfer.send(), send.transfer.recv()) == (send, recv) and send.transfer.boundary == stage
            numbers.add(send.transfer.number(m))
        for stage in range(1, n):  # backward: stage -> stage - 1
            send, recv = Action.parse(f"{stage}SEND_B{mb}"), Action.parse(f"{stage - 1}RECV_B{mb}")
            assert send.transfer == recv.transfer == (Direction.BACKWARD, stage, mb)
            assert (send.transfer.send(), send.transfer.recv()) == (send, recv) and send.transfer.boundary == stage - 1
            numbers.add(send.transfer.number(m))
    assert len(numbers) == 2 * (n - 1) * m and all(0 <= x < transfer_count(n, m) for x in numbers)
    # Dense: the last stage's last gradient takes the last number, so no table sized by
    # transfer_count is larger than needed.
    assert max(numbers) == transfer_count(n, m) - 1
    with pytest.raises(ValueError):
        Action.parse("0F0").transfer
