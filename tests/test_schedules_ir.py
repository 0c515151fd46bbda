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
    ],
)
def test_parse_and_print(text, action):
    assert Action.parse(text) == action
    assert str(action) == text


@given(st.integers(0, 10_000), st.sampled_from(list(Kind)), st.integers(0, 10_000))
def test_round_trip(stage, kind, microbatch):
    action = Action(stage, kind, microbatch)
    assert Action.parse(str(action)) == action


@pytest.mark.parametrize("bad", ["", "F1", "0F", "0X1", "0SEND1", "-1F0", "0F1x", "0 F 1", "0f1"])
def test_parse_rejects(bad):
    with pytest.raises(ScheduleError, match="cannot parse action"):
        Action.parse(bad)


def test_matching_pairs_follow_torch_convention():
    assert Action.parse("1SEND_F0").matching() == Action.parse("2RECV_F0")
    assert Action.parse("2SEND_B0").matching() == Action.parse("1RECV_B0")
    assert Action.parse("2RECV_F0").matching() == Action.parse("1SEND_F0")
    assert Action.parse("1RECV_B0").matching() == Action.parse("2SEND_B0")
    with pytest.raises(ValueError):
        Action.parse("0F0").matching()
