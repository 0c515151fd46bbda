"""Validation of schedules and programs.

Every failure raises ScheduleError with a message of the form
``[rule] rank R: ACTION ...`` so that the rule, the rank and the offending action
are all named. The deadlock check runs the program abstractly: compute and sends
never block, a RECV blocks its rank until the matching SEND has been issued.
These are the checks alone: `schedules.checked` lowers a schedule between them
(`validate`) and runs them once per schedule it builds, loads or lowers.
"""

from __future__ import annotations

from collections import deque
from typing import NoReturn

from .errors import ScheduleError
from .ir import COMPUTE_KINDS, Action, Direction, Kind, Transfer, transfer_count
from .schedule import Program, Schedule


def _fail(rule: str, where: str, text: str) -> ScheduleError:
    return ScheduleError(f"[{rule}] {where}: {text}")


def check_rules(schedule: Schedule) -> None:
    """Sizes, placement, index ranges, completeness and same-rank ordering."""
    p, m, v = schedule.ranks, schedule.microbatches, schedule.chunks
    if p < 1 or m < 1 or v < 1:
        raise _fail("sizes", "schedule", f"ranks, microbatches and chunks must be >= 1 (got p={p}, m={m}, v={v})")
    s2r = schedule.stage_to_rank
    if len(s2r) != p * v:
        raise _fail("placement", "schedule", f"{len(s2r)} stages placed, expected ranks*chunks = {p * v}")
    for stage, rank in enumerate(s2r):
        if not 0 <= rank < p:
            raise _fail("placement", f"stage {stage}", f"placed on rank {rank}, outside 0..{p - 1}")
    for rank, held in enumerate(schedule.rank_stages):
        if len(held) != v:
            raise _fail("placement", f"rank {rank}", f"holds stages {list(held)}; every rank must hold {v}")
    if len(schedule.order) != p:
        raise _fail("sizes", "schedule", f"order has {len(schedule.order)} rows, expected one per rank ({p})")

    num_stages = p * v
    # Which actions run, as bit masks: bit mb of present[4 * stage + code] is set when the
    # compute action (stage, kind with that code, mb) runs. Integers and masks instead of sets
    # of Actions: hashing an Action is a Python-level call, and this runs per action.
    present = [0] * (4 * num_stages)
    code_of = _CODE
    for rank, row in enumerate(schedule.order):
        for pos, action in enumerate(row):
            code = code_of.get(action.kind)
            stage, mb = action.stage, action.microbatch
            if code is None:
                raise _fail("compute-only", f"rank {rank}, position {pos}", f"{action} is a communication action; a Schedule holds F/B/I/W only")
            if not 0 <= stage < num_stages:
                raise _fail("stage-range", f"rank {rank}, position {pos}", f"{action} names stage {stage}, outside 0..{num_stages - 1}")
            if not 0 <= mb < m:
                raise _fail("microbatch-range", f"rank {rank}, position {pos}", f"{action} names microbatch {mb}, outside 0..{m - 1}")
            if s2r[stage] != rank:
                raise _fail("placement", f"rank {rank}, position {pos}", f"{action} runs stage {stage}, which sits on rank {s2r[stage]}")
            slot, bit = 4 * stage + code, 1 << mb
            if present[slot] & bit:
                raise _fail("duplicate", f"rank {rank}, position {pos}", f"{action} appears twice (first at position {row.index(action)})")
            present[slot] |= bit

    everything = (1 << m) - 1
    for stage in range(num_stages):
        f, b, i, w = present[4 * stage : 4 * stage + 4]
        broken = (everything & ~f) | (b & (i | w)) | (everything & ~(b | (i & w)))
        if broken:
            _fail_completeness(stage, s2r[stage], (broken & -broken).bit_length() - 1, present)

    # Ordering rules that hold on one rank (cross-rank order is the deadlock check's job): an
    # action's same-rank dependency that runs must have run before it, i.e. be in `done`.
    needs = _local_dependency_slots(schedule)
    done = [0] * (4 * num_stages)
    for rank, row in enumerate(schedule.order):
        for pos, action in enumerate(row):
            slot, bit = 4 * action.stage + code_of[action.kind], 1 << action.microbatch
            for dep in needs[slot]:
                if present[dep] & bit and not done[dep] & bit:
                    later = Action(dep // 4, COMPUTE_KINDS[dep % 4], action.microbatch)
                    raise _fail("order", f"rank {rank}, position {pos}", f"{action} comes before {later}, which it depends on")
            done[slot] |= bit


_CODE = {kind: code for code, kind in enumerate(COMPUTE_KINDS)}  # F, B, I, W -> 0..3


def _fail_completeness(stage: int, rank: int, mb: int, present: list[int]) -> NoReturn:
    """Raise the completeness rule that microbatch `mb` of `stage` breaks."""
    acts = {k: Action(stage, k, mb) for k in COMPUTE_KINDS}
    has = {k: bool(present[4 * stage + _CODE[k]] >> mb & 1) for k in COMPUTE_KINDS}
    where = f"rank {rank}"
    if not has[Kind.F]:
        raise _fail("missing-forward", where, f"{acts[Kind.F]} never runs")
    if has[Kind.B] and (has[Kind.I] or has[Kind.W]):
        raise _fail("backward-split", where, f"{acts[Kind.B]} and a split backward ({acts[Kind.I]}/{acts[Kind.W]}) both run")
    if has[Kind.I]:
        raise _fail("missing-backward", where, f"{acts[Kind.I]} runs but {acts[Kind.W]} never does")
    if has[Kind.W]:
        raise _fail("missing-backward", where, f"{acts[Kind.W]} runs but {acts[Kind.I]} never does")
    raise _fail("missing-backward", where, f"{acts[Kind.B]} (or {acts[Kind.I]} and {acts[Kind.W]}) never runs")


def _local_dependency_slots(schedule: Schedule) -> list[tuple[int, ...]]:
    """Per slot 4 * stage + code: the slots of the compute actions of the same microbatch that
    it needs and that sit on the same rank (F the previous stage's F; B and I the stage's F
    and the next stage's B or I; W the stage's I)."""
    s2r = schedule.stage_to_rank
    last = schedule.num_stages - 1
    needs: list[tuple[int, ...]] = []
    for s in range(schedule.num_stages):
        forward = (4 * (s - 1),) if s > 0 and s2r[s - 1] == s2r[s] else ()
        backward = (4 * s,) + ((4 * (s + 1) + 1, 4 * (s + 1) + 2) if s < last and s2r[s + 1] == s2r[s] else ())
        needs += [forward, backward, backward, (4 * s + 2,)]
    return needs


def find_deadlock(schedule: Schedule) -> bool:
    """Whether the lowered program of a schedule that passed check_rules deadlocks.

    Runs the compute order instead of the program: lowering puts each RECV right before the
    compute action that consumes it and each SEND right after the one that produces it, so a
    rank blocks before compute action X exactly when X takes a transfer from another rank whose
    producer has not run yet. A third of the actions of the program, and integers for transfers.
    """
    s2r = schedule.stage_to_rank
    num_stages, m = schedule.num_stages, schedule.microbatches
    # Per (stage, code): the transfer number (without the microbatch) this action takes from
    # another rank and the one it gives to another rank, or -1 (Transfer.number's layout).
    takes, gives = [-1] * (4 * num_stages), [-1] * (4 * num_stages)
    for s in range(num_stages):
        if s > 0 and s2r[s - 1] != s2r[s]:
            takes[4 * s] = (2 * (s - 1) + Direction.FORWARD) * m
        if s < num_stages - 1 and s2r[s + 1] != s2r[s]:
            gives[4 * s] = (2 * s + Direction.FORWARD) * m
            takes[4 * s + 1] = takes[4 * s + 2] = (2 * (s + 1) + Direction.BACKWARD) * m
        if s > 0 and s2r[s - 1] != s2r[s]:
            gives[4 * s + 1] = gives[4 * s + 2] = (2 * s + Direction.BACKWARD) * m
    code_of = _CODE
    rows = [[(4 * a.stage + code_of[a.kind], a.microbatch) for a in row] for row in schedule.order]
    produced = bytearray(transfer_count(num_stages, m))
    waiting: dict[int, int] = {}  # transfer number -> rank blocked on it
    pointer = [0] * len(rows)
    ready = deque(range(len(rows)))
    while ready:
        rank = ready.popleft()
        row = rows[rank]
        i = pointer[rank]
        while i < len(row):
            slot, mb = row[i]
            needed = takes[slot]
            if needed >= 0 and not produced[needed + mb]:
                waiting[needed + mb] = rank
                break
            made = gives[slot]
            if made >= 0:
                produced[made + mb] = 1
                woken = waiting.pop(made + mb, None)
                if woken is not None:
                    ready.append(woken)
            i += 1
        pointer[rank] = i
    return any(pointer[r] < len(row) for r, row in enumerate(rows))


def check_program(program: Program) -> None:
    """Streams agree with the schedule, transfers pair up, and nothing deadlocks."""
    schedule = program.schedule
    if len(program.streams) != schedule.ranks:
        raise _fail("sizes", "program", f"{len(program.streams)} streams, expected one per rank ({schedule.ranks})")
    num_stages = schedule.num_stages
    s2r = schedule.stage_to_rank
    m = schedule.microbatches
    # A SEND or RECV is named by (is it a SEND, its transfer): equal keys are equal actions.
    comm_seen: dict[tuple[bool, Transfer], tuple[Action, int, int]] = {}
    transfers: list[list[Transfer | None]] = []
    for rank, stream in enumerate(program.streams):
        compute = tuple(a for a in stream if a.kind.is_compute)
        if compute != schedule.order[rank]:
            raise _fail("stream-order", f"rank {rank}", "compute actions of the stream differ from the schedule's order")
        moved = [a.transfer if a.kind.is_comm else None for a in stream]
        transfers.append(moved)
        last = {(a.kind.is_send, t): i for i, (a, t) in enumerate(zip(stream, moved)) if t is not None}
        for pos, (action, transfer) in enumerate(zip(stream, moved)):
            if action.kind.is_collective:
                continue  # _check_grad_reductions
            if transfer is None:
                where = f"rank {rank}, position {pos}"
                here = s2r[action.stage]
                needed = action.consumes(num_stages)
                if needed is not None and s2r[needed.sender] != here and last.get((False, needed), len(stream)) > pos:
                    raise _fail("recv-before-use", where, f"{action} needs {needed.recv()} earlier on rank {rank}")
                made = action.produces(num_stages)
                if made is not None and s2r[made.receiver] != here and last.get((True, made), -1) < pos:
                    raise _fail("send-after-compute", where, f"{action} must be followed by {made.send()} on rank {rank}")
                continue
            where = f"rank {rank}, position {pos}"
            if not 0 <= action.stage < num_stages or not 0 <= action.microbatch < m:
                raise _fail("comm-range", where, f"{action} is outside stages 0..{num_stages - 1} or microbatches 0..{m - 1}")
            if s2r[action.stage] != rank:
                raise _fail("placement", where, f"{action} names stage {action.stage}, which sits on rank {s2r[action.stage]}")
            is_send = action.kind.is_send
            peer = transfer.receiver if is_send else transfer.sender
            if not 0 <= peer < num_stages or s2r[peer] == rank:
                raise _fail("comm-needed", where, f"{action} has no cross-rank peer (stage {peer})")
            if (is_send, transfer) in comm_seen:
                raise _fail("duplicate", where, f"{action} appears twice")
            comm_seen[(is_send, transfer)] = (action, rank, pos)
    for (is_send, transfer), (action, rank, pos) in comm_seen.items():
        if (not is_send, transfer) not in comm_seen:
            other, peer = (transfer.recv(), transfer.receiver) if is_send else (transfer.send(), transfer.sender)
            raise _fail("unmatched", f"rank {rank}, position {pos}", f"{action} has no matching {other} on rank {s2r[peer]}")
    _check_grad_reductions(program)
    _check_deadlock(program, transfers)


def _check_grad_reductions(program: Program) -> None:
    """REDUCE_GRAD (data parallelism): none at all, or one per stage, on the stage's rank,
    after the stage's last backward (B, or W with split backward) on that rank."""
    schedule = program.schedule
    s2r = schedule.stage_to_rank
    found: dict[int, tuple[int, int]] = {}
    for rank, stream in enumerate(program.streams):
        last_backward: dict[int, int] = {}
        for pos, action in enumerate(stream):
            if action.kind in (Kind.B, Kind.W):
                last_backward[action.stage] = pos
        for pos, action in enumerate(stream):
            if not action.kind.is_collective:
                continue
            where = f"rank {rank}, position {pos}"
            stage = action.stage
            if not 0 <= stage < schedule.num_stages or s2r[stage] != rank:
                raise _fail("placement", where, f"{action} names stage {stage}, which does not sit on rank {rank}")
            if stage in found:
                raise _fail("duplicate", where, f"{action} appears twice")
            found[stage] = (rank, pos)
            if last_backward.get(stage, len(stream)) > pos:
                raise _fail("reduce-after-backward", where,
                            f"{action} runs before stage {stage}'s last backward, whose gradients it reduces")
    if found and len(found) != schedule.num_stages:
        stage = min(set(range(schedule.num_stages)) - set(found))
        raise _fail("missing-reduce", f"rank {s2r[stage]}",
                    f"{stage}REDUCE_GRAD never runs, but other stages reduce their gradients")


def _check_deadlock(program: Program, transfers: list[list[Transfer | None]]) -> None:
    """Run the streams abstractly (`transfers[rank][i]`: what action i moves, None for compute)."""
    streams = program.streams
    s2r = program.schedule.stage_to_rank
    pointer = [0] * len(streams)
    sent: set[Transfer] = set()
    waiting: dict[Transfer, int] = {}  # transfer -> rank blocked on its RECV
    ready = deque(range(len(streams)))
    while ready:
        rank = ready.popleft()
        stream = streams[rank]
        moved = transfers[rank]
        i = pointer[rank]
        while i < len(stream):
            transfer = moved[i]
            if transfer is not None:
                if stream[i].kind.is_recv:
                    if transfer not in sent:
                        waiting[transfer] = rank
                        break
                else:
                    sent.add(transfer)
                    woken = waiting.pop(transfer, None)
                    if woken is not None:
                        ready.append(woken)
            i += 1
        pointer[rank] = i
    stuck = [r for r, s in enumerate(streams) if pointer[r] < len(s)]
    if not stuck:
        return
    lines = []
    for rank, stream in enumerate(streams):
        if pointer[rank] >= len(stream):
            lines.append(f"rank {rank}: finished")
            continue
        action = stream[pointer[rank]]
        send = action.transfer.send()
        lines.append(
            f"rank {rank}: blocked at {action} (action {pointer[rank]} of {len(stream)}), "
            f"waiting for {send} from rank {s2r[send.stage]}"
        )
    first = stuck[0]
    raise ScheduleError(
        f"[deadlock] rank {first}: {streams[first][pointer[first]]} can never complete under blocking "
        "receives; " + "; ".join(lines)
    )
