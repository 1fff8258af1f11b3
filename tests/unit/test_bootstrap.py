import numpy as np
import pytest
import torch

from profiling_agent.tools.evaluation.bootstrap import correct, paired_delta_ci


def test_identical_models_have_a_zero_width_interval():
    right = np.array([True, False, True, True] * 50)
    assert paired_delta_ci(right, right) == (0.0, 0.0)


def test_a_model_right_everywhere_the_other_is_wrong():
    assert paired_delta_ci(np.ones(100, bool), np.zeros(100, bool)) == (100.0, 100.0)
    assert paired_delta_ci(np.zeros(100, bool), np.ones(100, bool)) == (-100.0, -100.0)


def test_interval_covers_the_point_estimate_and_shrinks_with_more_images():
    rng = np.random.default_rng(1)
    base = rng.random(400) < 0.9
    cand = base.copy()
    cand[rng.choice(400, 20, replace=False)] = False  # 20 of 400 images flipped to wrong at most
    point = (cand.mean() - base.mean()) * 100
    low, high = paired_delta_ci(cand, base)
    assert low <= point <= high and high <= 0.0
    big_low, big_high = paired_delta_ci(np.tile(cand, 10), np.tile(base, 10))
    assert big_high - big_low < (high - low) / 2  # 10x the images: about 1/sqrt(10) the width


def test_pairing_matters_for_a_constant_shift():
    # the candidate is wrong on exactly 5 of 200 images the baseline got right: unpaired intervals would be wide
    base = np.ones(200, bool)
    base[:100] = False
    cand = base.copy()
    cand[100:105] = False
    low, high = paired_delta_ci(cand, base)
    assert -5.0 <= low <= high <= 0.0


def test_seeded_and_validated():
    a, b = np.array([True, False] * 30), np.array([True, True] * 30)
    assert paired_delta_ci(a, b, seed=3) == paired_delta_ci(a, b, seed=3)
    with pytest.raises(ValueError):
        paired_delta_ci(a, b[:10])
    with pytest.raises(ValueError):
        paired_delta_ci(a, b, level=1.5)
    assert correct(torch.tensor([1, 2, 3]), torch.tensor([1, 0, 3])).tolist() == [True, False, True]
