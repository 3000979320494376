"""A node's own decisions on its runs: its paired noise, its keep margin, a verifier's label."""

from __future__ import annotations

import pytest

from node import margins
from node.margins import MarginError, keep_or_discard, noise_margin, verdict


def test_noise_margin_is_k_standard_deviations_with_a_floor():
    assert noise_margin([1.0, 1.0]) == margins.DEFAULT_FLOOR
    assert noise_margin([1.0, 1.02]) == pytest.approx(2 * 0.0141421, rel=1e-4)
    with pytest.raises(MarginError, match="at least 2"):
        noise_margin([1.0])


def test_keep_needs_a_gain_larger_than_the_margin():
    assert keep_or_discard(1.40, 1.45, 0.01) == "keep"
    assert keep_or_discard(1.445, 1.45, 0.01) == "discard"
    assert keep_or_discard(None, 1.45, 0.01) == "crash"
    with pytest.raises(MarginError, match="run the parent"):
        keep_or_discard(1.4, None, 0.01)


def test_a_verifier_labels_its_look_confirm_refute_inconclusive_or_crash():
    assert verdict(1.40, 1.45, 0.01) == "confirm"
    assert verdict(1.46, 1.45, 0.01) == "refute"
    assert verdict(1.445, 1.45, 0.01) == "inconclusive"
    assert verdict(None, 1.45, 0.01) == "crash"
    assert verdict(1.444, 1.45, 0.01, [0.006, 0.006, 0.006]) == "confirm"  # mean of 4, margin / 2


def test_paired_noise_pools_the_spread_of_each_pair_around_its_own_mean():
    sigma, df = margins.paired_noise({("p", "c"): [0.01, 0.03], ("p", "d"): [-0.02, -0.02]}, 0.0, 0)
    assert df == 2 and sigma == pytest.approx((0.0002 / 2) ** 0.5)
    assert margins.paired_noise({}, 0.004) == (0.004, 0)


def test_the_margin_shrinks_with_the_runs_behind_a_mean_and_has_a_floor():
    assert margins.margin_for(0.01, 4) == pytest.approx(0.01)
    assert margins.margin_for(0.0001, 1) == margins.DEFAULT_FLOOR
