"""The faster build/lower/validate gives the programs and verdicts of the code before it.

tests/fixtures/lowered_programs.json was written by the schedules package at commit 804e78e
(before validation was sped up; tests/fixtures/make_lowered_programs.py says how): for a grid
of shapes of every generator, the hash of each lowered program (or the refusal), and for
seeded random mutations of small schedules, the first error message (or the program).
"""

import json
import random
from pathlib import Path

import pytest

import schedules
from schedules import ScheduleError
from schedules.lowering import insert_comms
from schedules.validate import check_program, check_rules

from fixtures.make_lowered_programs import build, digest, mutate

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "lowered_programs.json").read_text())


def outcome(make) -> dict:
    try:
        return digest(make())
    except ScheduleError as exc:
        return {"error": str(exc)}


def expected(entry: dict) -> dict:
    return {k: entry[k] for k in ("sha256", "actions", "error") if k in entry}


@pytest.mark.parametrize("entry", FIXTURE["programs"], ids=lambda e: f"{e['schedule']}-{e['ranks']}-{e['microbatches']}-{e['chunks']}")
def test_programs_identical_to_the_old_code(entry):
    got = outcome(lambda: schedules.lower(build(entry["schedule"], entry["ranks"], entry["microbatches"], entry["chunks"])))
    assert got == expected(entry)


def test_mutated_schedules_get_the_old_verdicts():
    mismatches = []
    for entry in FIXTURE["mutated"]:
        schedule = build(entry["schedule"], entry["ranks"], entry["microbatches"], entry["chunks"])
        bad = mutate(schedule, random.Random(entry["seed"]))
        got = outcome(lambda: schedules.lower(bad))
        if got != expected(entry):
            mismatches.append((entry, got))
    assert not mismatches, mismatches[:3]
    assert sum("error" in e for e in FIXTURE["mutated"]) > 300  # the fixture exercises the rejections


def test_every_lowered_program_passes_the_full_program_check():
    """build() checks a generated schedule's rules, lowers it and checks only what lowering
    does not guarantee by construction; the full check of a program (as for a loaded one)
    still accepts every lowered program, and rejects the same mutated ones."""
    for entry in FIXTURE["programs"]:
        if "error" in entry or entry["actions"] > 20000:
            continue
        schedule = build(entry["schedule"], entry["ranks"], entry["microbatches"], entry["chunks"])
        program = insert_comms(schedule)
        check_rules(schedule)
        check_program(program)
        assert schedules.validate(program) is None
