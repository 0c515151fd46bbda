"""Broken schedules are rejected with the right message; random mutations never hang."""

import time
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from schedules import Action, Program, ScheduleError, build, lower, validate
from schedules.lowering import insert_comms


def with_order(schedule, rows):
    return replace(schedule, order=tuple(tuple(Action.parse(a) for a in r.split()) for r in rows))


def base():
    return build("1f1b", ranks=2, microbatches=2)  # rows: 0F0 0F1 0B0 0B1 / 1F0 1B0 1F1 1B1


def test_swapped_forward_and_backward_on_one_stage():
    bad = with_order(base(), ["0F0 0B0 0F1 0B1", "1B0 1F0 1F1 1B1"])
    with pytest.raises(ScheduleError, match=r"\[order\] rank 1, position 0: 1B0 comes before 1F0"):
        validate(bad)


def test_missing_backward():
    bad = with_order(base(), ["0F0 0F1 0B0 0B1", "1F0 1B0 1F1"])
    with pytest.raises(ScheduleError, match=r"\[missing-backward\] rank 1: 1B1 .* never runs"):
        validate(bad)


def test_out_of_range_microbatch():
    bad = with_order(base(), ["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1 1F2"])
    with pytest.raises(ScheduleError, match=r"\[microbatch-range\] rank 1, position 4: 1F2 names microbatch 2, outside 0..1"):
        validate(bad)


def test_action_on_wrong_rank():
    bad = with_order(base(), ["0F0 0F1 0B0 0B1 1F0", "1B0 1F1 1B1"])
    with pytest.raises(ScheduleError, match=r"\[placement\] rank 0, position 4: 1F0 runs stage 1, which sits on rank 1"):
        validate(bad)


def test_duplicate_and_split_backward_mixing():
    with pytest.raises(ScheduleError, match=r"\[duplicate\]"):
        validate(with_order(base(), ["0F0 0F1 0B0 0B1 0B1", "1F0 1B0 1F1 1B1"]))
    with pytest.raises(ScheduleError, match=r"\[backward-split\]"):
        validate(with_order(base(), ["0F0 0F1 0B0 0B1", "1F0 1B0 1I0 1W0 1F1 1B1"]))
    with pytest.raises(ScheduleError, match=r"\[order\] .*1W0 comes before 1I0"):
        validate(with_order(base(), ["0F0 0F1 0B0 0B1", "1F0 1W0 1I0 1F1 1B1"]))


def test_split_backward_is_legal():
    validate(with_order(base(), ["0F0 0F1 0I0 0W0 0B1", "1F0 1I0 1F1 1I1 1W0 1W1"]))


def test_deadlock_names_every_rank():
    # Rank 0 waits for gradient 0 before sending forward 1; rank 1 waits for forward 1 first.
    bad = with_order(base(), ["0F0 0B0 0F1 0B1", "1F0 1F1 1B0 1B1"])
    start = time.perf_counter()
    with pytest.raises(ScheduleError) as info:
        validate(bad)
    assert time.perf_counter() - start < 1.0
    message = str(info.value)
    assert message.startswith("[deadlock]")
    assert "rank 0: blocked at 0RECV_B0" in message and "waiting for 1SEND_B0 from rank 1" in message
    assert "rank 1: blocked at 1RECV_F1" in message and "waiting for 0SEND_F1 from rank 0" in message


def test_program_checks_transfers():
    program = lower(base())
    streams = [list(s) for s in program.streams]
    streams[1].remove(Action.parse("1RECV_F1"))
    with pytest.raises(ScheduleError, match=r"\[recv-before-use\] rank 1, position \d+: 1F1 needs 1RECV_F1"):
        validate(Program(program.schedule, tuple(map(tuple, streams))))
    streams = [list(s) for s in program.streams]
    streams[0].append(Action.parse("0SEND_F0"))
    with pytest.raises(ScheduleError, match=r"\[duplicate\]"):
        validate(Program(program.schedule, tuple(map(tuple, streams))))
    streams = [list(s) for s in program.streams]
    streams[0].insert(0, Action.parse("0RECV_F0"))
    with pytest.raises(ScheduleError, match=r"\[comm-needed\] rank 0, position 0: 0RECV_F0"):
        validate(Program(program.schedule, tuple(map(tuple, streams))))


def test_program_with_early_receive_is_fine_but_a_late_one_deadlocks():
    program = lower(base())
    s1 = list(program.streams[1])
    recv = Action.parse("1RECV_F1")
    s1.remove(recv)
    s1.insert(0, recv)  # posted early, as torch's lowering does: still deadlock-free
    validate(Program(program.schedule, (program.streams[0], tuple(s1))))
    # Posted too early, before this rank's own sends that the peer needs first: deadlock.
    s0 = list(program.streams[0])
    late = Action.parse("0RECV_B1")
    s0.remove(late)
    s0.insert(0, late)
    with pytest.raises(ScheduleError) as info:
        validate(Program(program.schedule, (tuple(s0), program.streams[1])))
    message = str(info.value)
    assert message.startswith("[deadlock] rank 0: 0RECV_B1 can never complete")
    assert "rank 0: blocked at 0RECV_B1 (action 0 of 8), waiting for 1SEND_B1 from rank 1" in message
    assert "rank 1: blocked at 1RECV_F0 (action 0 of 8), waiting for 0SEND_F0 from rank 0" in message


def test_program_with_late_send_is_fine_until_it_passes_the_receive_that_waits_on_it():
    """The send side of the deadlock check: a SEND may come later than its compute, but not
    after a RECV that can only complete once the peer got it."""
    program = lower(base())  # rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1
    send = Action.parse("0SEND_F1")

    def moved_after(anchor: str) -> Program:
        s0 = list(program.streams[0])
        s0.remove(send)
        s0.insert(s0.index(Action.parse(anchor)) + 1, send)
        return Program(program.schedule, (tuple(s0), program.streams[1]))

    validate(moved_after("0RECV_B0"))  # rank 1 returns gradient 0 before it needs forward 1
    validate(moved_after("0B0"))
    with pytest.raises(ScheduleError) as info:
        validate(moved_after("0RECV_B1"))  # gradient 1 needs forward 1, which now waits for it
    message = str(info.value)
    assert message.startswith("[deadlock]")
    assert "rank 0: blocked at 0RECV_B1 (action 5 of 8), waiting for 1SEND_B1 from rank 1" in message
    assert "rank 1: blocked at 1RECV_F1 (action 4 of 8), waiting for 0SEND_F1 from rank 0" in message


SCHEDULE_PARAMS = st.one_of(
    st.tuples(st.just("gpipe"), st.integers(1, 8), st.integers(1, 24), st.none()),
    st.tuples(st.just("1f1b"), st.integers(1, 8), st.integers(1, 24), st.none()),
    st.integers(1, 6).flatmap(
        lambda p: st.tuples(st.just("interleaved"), st.just(p), st.integers(1, 4).map(lambda k: k * p), st.integers(2, 4))
    ),
)


@settings(max_examples=150, deadline=None)
@given(SCHEDULE_PARAMS)
def test_random_legal_parameters_validate(params):
    name, p, m, v = params
    program = lower(build(name, ranks=p, microbatches=m, chunks=v))
    assert len(program.streams) == p


MUTATIONS = ("swap", "delete", "duplicate", "move-rank", "microbatch", "stage")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SCHEDULE_PARAMS, st.sampled_from(MUTATIONS), st.randoms(use_true_random=False))
def test_random_mutations_are_valid_or_rejected(params, mutation, rnd):
    name, p, m, v = params
    schedule = build(name, ranks=p, microbatches=m, chunks=v)
    rows = [list(r) for r in schedule.order]
    r = rnd.randrange(p)
    row = rows[r]
    i = rnd.randrange(len(row))
    if mutation == "swap":
        j = rnd.randrange(len(row))
        row[i], row[j] = row[j], row[i]
    elif mutation == "delete":
        del row[i]
    elif mutation == "duplicate":
        row.insert(rnd.randrange(len(row) + 1), row[i])
    elif mutation == "move-rank":
        rows[rnd.randrange(p)].append(row.pop(i))
    elif mutation == "microbatch":
        row[i] = Action(row[i].stage, row[i].kind, rnd.randrange(m + 2))
    else:
        row[i] = Action(rnd.randrange(schedule.num_stages + 2), row[i].kind, row[i].microbatch)
    mutated = replace(schedule, order=tuple(map(tuple, rows)))
    try:
        validate(mutated)
    except ScheduleError as exc:
        assert str(exc).startswith("[")
        return
    # Accepted mutations must really be runnable: lowering gives a complete program.
    assert insert_comms(mutated).num_actions >= 2 * schedule.num_stages * m


def test_a_schedule_is_checked_once(monkeypatch, tmp_path):
    """build() and the loaders check a schedule (rules, lowering, deadlock) and keep the checked
    program: lowering it again hands that program out unchecked; a changed copy is checked anew."""
    import schedules.checked as checked
    from schedules import load_program_json, save_json

    real, calls = checked.check_schedule, []
    monkeypatch.setattr(checked, "check_schedule", lambda s: calls.append(s) or real(s))
    schedule = build("1f1b", ranks=2, microbatches=2)
    assert calls == [schedule]
    program = lower(schedule)
    assert lower(schedule) is program and calls == [schedule]
    save_json(schedule, tmp_path / "s.json")
    assert load_program_json(tmp_path / "s.json").streams == program.streams and len(calls) == 2
    bad = with_order(schedule, ["0F0 0B0 0F1 0B1", "1F0 1F1 1B0 1B1"])
    with pytest.raises(ScheduleError, match=r"\[deadlock\]"):
        lower(bad)
    assert calls[-1] is bad


def _with_streams(program, rows):
    return Program(program.schedule, tuple(tuple(Action.parse(a) for a in r.split()) for r in rows))


@pytest.mark.parametrize("rows, message", [
    (["0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1 0REDUCE_GRAD",
      "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1REDUCE_GRAD"], None),
    (["0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1 1REDUCE_GRAD",
      "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1REDUCE_GRAD"],
     "[placement] rank 0, position 8: 1REDUCE_GRAD names stage 1, which does not sit on rank 0"),
    (["0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1 0REDUCE_GRAD 0REDUCE_GRAD",
      "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1REDUCE_GRAD"],
     "[duplicate] rank 0, position 9: 0REDUCE_GRAD appears twice"),
    (["0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0REDUCE_GRAD 0RECV_B1 0B1",
      "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1REDUCE_GRAD"],
     "[reduce-after-backward] rank 0, position 6: 0REDUCE_GRAD runs before stage 0's last backward, "
     "whose gradients it reduces"),
    (["0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1",
      "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1REDUCE_GRAD"],
     "[missing-reduce] rank 0: 0REDUCE_GRAD never runs, but other stages reduce their gradients"),
])
def test_gradient_reductions_one_per_stage_after_its_last_backward(rows, message):
    """REDUCE_GRAD (data parallelism): none, or one per stage on its rank after its last backward."""
    program = _with_streams(lower(base()), rows)
    if message is None:
        validate(program)
        return
    with pytest.raises(ScheduleError) as info:
        validate(program)
    assert str(info.value) == message


@pytest.mark.parametrize("row1, message", [
    ("1F0 1B0", "[missing-forward] rank 1: 1F1 never runs"),
    ("1F0 1B0 1F1 1B1 1I1 1W1", "[backward-split] rank 1: 1B1 and a split backward (1I1/1W1) both run"),
    ("1F0 1B0 1F1 1I1", "[missing-backward] rank 1: 1I1 runs but 1W1 never does"),
    ("1F0 1B0 1F1 1W1", "[missing-backward] rank 1: 1W1 runs but 1I1 never does"),
    ("1F0 1B0 1F1", "[missing-backward] rank 1: 1B1 (or 1I1 and 1W1) never runs"),
])
def test_each_incomplete_microbatch_names_what_is_missing(row1, message):
    bad = with_order(base(), ["0F0 0F1 0B0 0B1", row1])
    with pytest.raises(ScheduleError) as info:
        validate(bad)
    assert str(info.value) == message


@pytest.mark.parametrize("rows, message", [
    (["0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1"], "[sizes] program: 1 streams, expected one per rank (2)"),
    (["0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1", "1RECV_F0 1F0 1RECV_F1 1F1 1B0 1SEND_B0 1B1 1SEND_B1"],
     "[stream-order] rank 1: compute actions of the stream differ from the schedule's order"),
    (["0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1 2SEND_F0",
      "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1"],
     "[comm-range] rank 0, position 8: 2SEND_F0 is outside stages 0..1 or microbatches 0..1"),
    (["0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1 0SEND_F2",
      "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1"],
     "[comm-range] rank 0, position 8: 0SEND_F2 is outside stages 0..1 or microbatches 0..1"),
    (["0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1 1RECV_F0",
      "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1"],
     "[placement] rank 0, position 8: 1RECV_F0 names stage 1, which sits on rank 1"),
    (["0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1",
      "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1SEND_F1"],
     "[comm-needed] rank 1, position 8: 1SEND_F1 has no cross-rank peer (stage 2)"),
    (["0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1",
      "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1SEND_B1"],
     "[duplicate] rank 1, position 8: 1SEND_B1 appears twice"),
    # A compute action's SEND before it, or missing (at the first and at a later position).
    (["0SEND_F0 0F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1",
      "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1"],
     "[send-after-compute] rank 0, position 1: 0F0 must be followed by 0SEND_F0 on rank 0"),
    (["0F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1",
      "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1"],
     "[send-after-compute] rank 0, position 0: 0F0 must be followed by 0SEND_F0 on rank 0"),
    (["0F0 0SEND_F0 0F1 0RECV_B0 0B0 0RECV_B1 0B1",
      "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1"],
     "[send-after-compute] rank 0, position 2: 0F1 must be followed by 0SEND_F1 on rank 0"),
    # A RECV after the compute action that needs it.
    (["0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1",
      "1RECV_F0 1F0 1B0 1SEND_B0 1F1 1RECV_F1 1B1 1SEND_B1"],
     "[recv-before-use] rank 1, position 4: 1F1 needs 1RECV_F1 earlier on rank 1"),
])
def test_each_program_rule_names_rank_position_and_action(rows, message):
    with pytest.raises(ScheduleError) as info:
        validate(_with_streams(lower(base()), rows))
    assert str(info.value) == message


@pytest.mark.parametrize("changes, message", [
    ({"ranks": 0}, "[sizes] schedule: ranks, microbatches and chunks must be >= 1 (got p=0, m=1, v=2)"),
    ({"microbatches": 0}, "[sizes] schedule: ranks, microbatches and chunks must be >= 1 (got p=1, m=0, v=2)"),
    ({"stage_to_rank": (0,)}, "[placement] schedule: 1 stages placed, expected ranks*chunks = 2"),
    ({"order": "1F0 0F0 1B0 0B0"}, "[order] rank 0, position 0: 1F0 comes before 0F0, which it depends on"),
    ({"order": "0F0 1F0 0B0 1B0"}, "[order] rank 0, position 2: 0B0 comes before 1B0, which it depends on"),
    ({"order": "0F0 1F0 0I0 1I0 1W0 0W0"}, "[order] rank 0, position 2: 0I0 comes before 1I0, which it depends on"),
    ({"order": "0F0 1F0 1I0 0W0 0I0 1W0"}, "[order] rank 0, position 3: 0W0 comes before 0I0, which it depends on"),
])
def test_two_stages_on_one_rank_keep_their_dependencies(changes, message):
    """One rank holding both stages (interleaved p=1, v=2): the order on the rank alone must
    respect that stage 1's F needs stage 0's, and stage 0's backward stage 1's."""
    schedule = build("interleaved", ranks=1, microbatches=1, chunks=2)
    changes = dict(changes)  # the parameter itself is shared by every run of the test
    if "order" in changes:
        schedule = with_order(schedule, [changes.pop("order")])
    with pytest.raises(ScheduleError) as info:
        validate(replace(schedule, **changes))
    assert str(info.value) == message
    validate(with_order(build("interleaved", ranks=1, microbatches=1, chunks=2), ["0F0 1F0 1I0 0I0 0W0 1W0"]))


@pytest.mark.parametrize("name, changes, message", [
    ("1f1b", {"order": ["0F0 0F1 0B0 0B1 0SEND_F0", "1F0 1B0 1F1 1B1"]},
     "[compute-only] rank 0, position 4: 0SEND_F0 is a communication action; a Schedule holds F/B/I/W only"),
    ("1f1b", {"order": ["0F0 0F1 0B0 0B1 2F0", "1F0 1B0 1F1 1B1"]},
     "[stage-range] rank 0, position 4: 2F0 names stage 2, outside 0..1"),
    ("1f1b", {"order": ["0F0 0F1 0B0 0B1 0F1", "1F0 1B0 1F1 1B1"]},
     "[duplicate] rank 0, position 4: 0F1 appears twice (first at position 1)"),
    ("1f1b", {"order": ["0F0 0F1 0B0 0B1"]}, "[sizes] schedule: order has 1 rows, expected one per rank (2)"),
    ("1f1b", {"stage_to_rank": (0, 2)}, "[placement] stage 1: placed on rank 2, outside 0..1"),
    ("interleaved", {"stage_to_rank": (0, 0, 0, 1)}, "[placement] rank 0: holds stages [0, 1, 2]; every rank must hold 2"),
    ("1f1b", {"order": ["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1 1I1"]},
     "[backward-split] rank 1: 1B1 and a split backward (1I1/1W1) both run"),  # B with I alone
])
def test_each_schedule_rule_names_where_and_what(name, changes, message):
    schedule = build(name, ranks=2, microbatches=2)
    changes = dict(changes)  # the parameter itself is shared by every run of the test
    if "order" in changes:
        schedule = with_order(schedule, changes.pop("order"))
    with pytest.raises(ScheduleError) as info:
        validate(replace(schedule, **changes))
    assert str(info.value) == message


def test_split_backward_program_with_a_receive_too_early_deadlocks():
    """The deadlock check with I and W: rank 0 waits for gradient 1 before sending forward 1."""
    program = lower(build("zb-h1", ranks=2, microbatches=2))
    rows = ["0F0 0SEND_F0 0F1 0RECV_B1 0SEND_F1 0RECV_B0 0I0 0W0 0I1 0W1",
            "1RECV_F0 1F0 1I0 1SEND_B0 1RECV_F1 1F1 1I1 1SEND_B1 1W0 1W1"]
    with pytest.raises(ScheduleError) as info:
        validate(_with_streams(program, rows))
    message = str(info.value)
    assert message.startswith("[deadlock] rank 0: 0RECV_B1 can never complete under blocking receives; ")
    assert "rank 1: blocked at 1RECV_F1 (action 4 of 10), waiting for 0SEND_F1 from rank 0" in message
    validate(_with_streams(program, [rows[0].replace("0RECV_B1 0SEND_F1", "0SEND_F1 0RECV_B1"), rows[1]]))
