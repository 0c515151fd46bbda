"""The zero-bubble paper's bubble rates (Qi et al., ICLR 2024, Table 5) from its profiled
costs (Table 9): the hand-written orders reproduce them to the published 4 decimals with
`bubble_ratio_rank_span`, the paper's measure (longest stage span)."""

from __future__ import annotations

from pathlib import Path

import pytest

import schedules
from sim import simulate
from scripts import load_script

DATA = Path(__file__).resolve().parents[1] / "bench" / "zero_bubble_paper.py"


def load_paper():
    return load_script(DATA)


PAPER = load_paper()


@pytest.mark.parametrize("setting", PAPER.SETTINGS, ids=lambda s: f"{s.model}-m{s.microbatches}")
def test_hand_written_orders_give_the_published_bubble_rates(setting):
    costs = PAPER.cost_model(setting)
    for name in ("1f1b", "zb-h1", "zb-h2"):
        result = simulate(schedules.build(name, setting.ranks, setting.microbatches), costs)
        assert round(result.bubble_ratio_rank_span, 4) == setting.rates[name], name
