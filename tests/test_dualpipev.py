"""DualPipeV: torch.distributed.pipelining's order, validity and in-flight memory, and
DeepSeek's published bubble.

DeepSeek's DualPipe README (github.com/deepseek-ai/DualPipe, also DeepSeek-V3 report,
Table 2) gives DualPipeV on PP = 2p stages over p ranks a bubble of
(PP/2 - 1)(F&B + B - 3W) and PP + 1 chunk activations per rank, with F, B (full backward)
and W per chunk and F&B the time of an overlapped forward-backward pair. Run as one unit
(no overlap gain, F&B = F + B, both outputs leave when the pair ends) the simulator gives
exactly that when F = I and W <= F; run as two actions (this project's IR and executor),
the forward's output leaves when F ends and every rank idles (p-1)F less.
"""

from __future__ import annotations

import itertools

import pytest

import schedules
from schedules import Action, Kind, Program, build, lower, peak_in_flight
from sim import CostModel, simulate

NS = 1_000_000_000


def _torch_order(p: int, m: int):
    """torch's ScheduleDualPipeV order, from its (private) per-rank generator, with each
    overlapped pair (OVERLAP_F_B) flattened into its sub-actions, forward then backward."""
    torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    dualpipev = object.__new__(torch_schedules.ScheduleDualPipeV)
    dualpipev.pp_group_size, dualpipev._n_microbatches = p, m
    rows = []
    for r in range(p):
        row = []
        for action in dualpipev._calculate_single_rank_operations(r):
            parts = action.sub_actions if action.sub_actions is not None else (action,)
            row += [Action.parse(str(a)) for a in parts]
        rows.append(tuple(row))
    return tuple(rows)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6])
def test_agrees_with_torch_pipelining(p):
    for m in (2 * p, 2 * p + 1, 3 * p, 5 * p + 2):
        assert build("dualpipev", ranks=p, microbatches=m).order == _torch_order(p, m)


def test_by_hand_p2_m4():
    # Rank 0 holds stages 0 and 3, rank 1 stages 1 and 2. Rank 0: 2 forwards of a, (Fa, Fb),
    # (Ib, W, Fb), then the pairs (Fa, Bb) (Fb, Ba), ..., and the split tail.
    s = build("dualpipev", ranks=2, microbatches=4)
    assert s.stage_to_rank == (0, 1, 1, 0)
    assert [" ".join(map(str, row)) for row in s.order] == [
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 0F3 3B1 3F2 0B0 3B2 3F3 0B1 3B3 0I2 0W2 0I3 0W3",
        "1F0 2F0 1F1 2F1 1F2 2B0 2F2 1B0 1F3 2B1 2F3 1B1 2B2 1B2 2I3 1I3 2W3 1W3",
    ]


def test_fewer_microbatches_cut_the_2p_order_down():
    full = build("dualpipev", ranks=3, microbatches=6)
    for m in range(1, 6):
        assert build("dualpipev", ranks=3, microbatches=m).order == tuple(
            tuple(a for a in row if a.microbatch < m) for row in full.order
        )


@pytest.mark.parametrize("p", range(1, 7))
def test_valid_and_holds_pp_plus_one_chunk_activations(p):
    """Every size lowers and validates (deadlock check included); with m >= 2p every rank
    holds at most 2p+1 chunk-microbatches (F done, B or W not yet): DeepSeek's PP + 1."""
    for m in range(1, 4 * p + 2):
        schedule = build("dualpipev", ranks=p, microbatches=m)
        lower(schedule)
        peaks = peak_in_flight(schedule)
        assert max(peaks) <= 2 * p + 1
        if m >= 2 * p:
            assert peaks == [2 * p + 1] * p


def as_one_unit(program: Program) -> Program:
    """Each overlapped pair (an F directly followed by a B of the rank's other chunk) run as
    one unit: its receives before the F, its sends after the B. Rank p-1's first pair is
    not overlapped in DualPipe and keeps its order."""
    p = program.schedule.ranks
    streams = []
    for rank, stream in enumerate(program.streams):
        compute = [k for k, a in enumerate(stream) if a.kind.is_compute]
        pairs = {x: y for x, y in zip(compute, compute[1:])
                 if stream[x].kind is Kind.F and stream[y].kind is Kind.B}
        if rank == p - 1:
            pairs.pop(min(pairs))
        out, k = [], 0
        while k < len(stream):
            if k not in pairs:
                out.append(stream[k])
                k += 1
                continue
            y = pairs[k]
            end = y + 1
            while end < len(stream) and stream[end].kind.is_send:
                end += 1
            between = stream[k + 1:y]
            out += [a for a in between if a.kind.is_recv] + [stream[k], stream[y]]
            out += [a for a in between if a.kind.is_send] + list(stream[y + 1:end])
            k = end
        streams.append(tuple(out))
    return Program(program.schedule, tuple(streams))


@pytest.mark.parametrize("p", [2, 3, 4, 6])
def test_deepseek_bubble_with_the_pair_as_one_unit(p):
    """F = I and W <= F (chunk costs): with each pair costing F&B = F + B as one unit, every
    rank idles (p-1)(F&B + B - 3W) of the makespan; as two actions, (p-1)(F + I - W)."""
    for m in (2 * p, 3 * p + 1):
        schedule = build("dualpipev", ranks=p, microbatches=m)
        unit = as_one_unit(lower(schedule))
        for f, w in [(1, 1), (2, 1), (3, 2), (4, 1), (2, 0)]:
            i = f
            costs = CostModel(forward=2 * f, backward_input=2 * i, backward_weight=2 * w)  # two chunks a rank
            pair, full = f + i + w, i + w
            one = simulate(unit, costs)
            assert {one.makespan_ns - b for b in one.busy_ns} == {(p - 1) * (pair + full - 3 * w) * NS}, (m, f, w)
            two = simulate(schedule, costs)
            assert {two.makespan_ns - b for b in two.busy_ns} == {(p - 1) * (f + i - w) * NS}, (m, f, w)


def test_pair_as_one_unit_is_slower_whenever_forward_and_input_gradient_differ():
    """Off F = I the formula is not exact, but the pair run as two actions never idles more."""
    for p, (f, i, w) in itertools.product((2, 3, 4), itertools.product(range(1, 4), repeat=3)):
        schedule = build("dualpipev", ranks=p, microbatches=3 * p)
        costs = CostModel(forward=2 * f, backward_input=2 * i, backward_weight=2 * w)
        assert simulate(schedule, costs).makespan_ns <= simulate(as_one_unit(lower(schedule)), costs).makespan_ns


def test_registered_as_two_stages_per_rank():
    assert "dualpipev" in schedules.available()
    assert schedules.generator("dualpipev").chunks == 2
    assert build("dualpipev", ranks=3, microbatches=6).placement == "v"
