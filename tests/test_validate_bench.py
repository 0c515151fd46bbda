"""bench/validate_sim.py: the ranking checks, on a hand-made results table."""

from pathlib import Path

import pandas as pd
from scripts import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "validate_sim.py"


def load_bench():
    return load_script(SCRIPT)


def row(schedule, runs, predicted):
    return {"model": "mlp", "calibration": "1f1b:8", "schedule": schedule, "microbatches": 4,
            "measured_ms": sorted(runs)[len(runs) // 2], "runs_ms": " ".join(str(r) for r in runs),
            "predicted_ms": predicted}


def test_rankings_separate_reproducible_differences_from_ties():
    # gpipe's runs all lie below interleaved's: a measured difference. 1f1b overlaps both: ties.
    table = pd.DataFrame([
        row("gpipe", [100.0, 101.0, 102.0], 110.0),
        row("1f1b", [101.5, 103.5, 99.0], 90.0),
        row("interleaved", [103.0, 104.0, 105.0], 95.0),
    ])
    (r,) = load_bench().rankings(table)
    assert r["measured_order"] == ["gpipe", "1f1b", "interleaved"]  # medians 101, 101.5, 104
    assert r["predicted_order"] == ["1f1b", "interleaved", "gpipe"] and not r["same"]
    assert r["round_orders"] == [["gpipe", "1f1b", "interleaved"], ["gpipe", "1f1b", "interleaved"],
                                 ["1f1b", "gpipe", "interleaved"]]
    assert not r["rounds_agree"]
    assert r["significant_pairs"] == [{"faster": "gpipe", "slower": "interleaved", "predicted_same": False}]
    assert not r["significant_same"]
    # Predicting gpipe below interleaved satisfies the one measured difference, whatever 1f1b does.
    table.loc[table["schedule"] == "gpipe", "predicted_ms"] = 92.0  # 1f1b < gpipe < interleaved
    (r,) = load_bench().rankings(table)
    assert r["significant_same"] and not r["same"]
