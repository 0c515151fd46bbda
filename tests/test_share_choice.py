"""sim.share_choice.choose_share: the grid search over idle shares, on error functions of known minimum."""

import pytest

from sim.share_choice import COARSE, IDLE_SHARES, choose_share


@pytest.mark.parametrize("truth,chosen", [(0.35, 0.35), (0.6, 0.6), (0.0, 0.0), (1.0, 1.0), (0.42, 0.4)])
def test_the_grid_share_nearest_a_v_shaped_minimum_is_found(truth, chosen):
    """|share - truth|: the coarse scan, then its best's neighbours at 0.05 (0.35 lies between two
    coarse shares equally near: the tie goes to the smaller, 0.3, whose neighbour 0.35 wins)."""
    share, tried = choose_share(lambda s: s, lambda s: abs(s - truth))
    assert share == pytest.approx(chosen)
    assert set(COARSE) <= set(tried) <= set(IDLE_SHARES) and len(tried) <= len(COARSE) + 2
    assert all(tried[s] == (abs(s - truth), s) for s in tried)  # each candidate fitted once, kept with its error


def test_a_minimum_between_two_worse_regions_is_found_by_the_whole_coarse_scan():
    """Not unimodal (as a measured run's replay error by share: 0.7% at 0, 2.6% at 0.5, 1.2% at 1):
    a search from one end that stopped at the first rise would keep 0."""
    errors = {0.0: 0.007, 0.1: 0.02, 0.2: 0.03, 0.3: 0.04, 0.4: 0.05, 0.5: 0.026, 0.6: 0.02, 0.7: 0.004,
              0.8: 0.012, 0.9: 0.02, 1.0: 0.012, 0.65: 0.009, 0.75: 0.003}
    share, _ = choose_share(lambda s: round(s, 2), lambda s: errors[s])
    assert share == pytest.approx(0.75)
