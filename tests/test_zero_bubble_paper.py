"""The zero-bubble paper's bubble rates (Qi et al., ICLR 2024, Table 5) from its profiled
costs (Table 9): the hand-written orders reproduce them to the published 4 decimals with
`bubble_ratio_rank_span`, the paper's measure (longest stage span)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import schedules
from sim import simulate

DATA = Path(__file__).resolve().parents[1] / "bench" / "zero_bubble_paper.py"


def load_paper():
    spec = importlib.util.spec_from_file_location("zero_bubble_paper", DATA)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


PAPER = load_paper()


@pytest.mark.parametrize("setting", PAPER.SETTINGS, ids=lambda s: f"{s.model}-m{s.microbatches}")
def test_hand_written_orders_give_the_published_bubble_rates(setting):
    costs = PAPER.cost_model(setting)
    for name in ("1f1b", "zb-h1", "zb-h2"):
        result = simulate(schedules.build(name, setting.ranks, setting.microbatches), costs)
        assert round(result.bubble_ratio_rank_span, 4) == setting.rates[name], name
