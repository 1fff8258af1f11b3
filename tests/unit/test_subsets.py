import numpy as np
import pytest

from profiling_agent.tools.data.subsets import draw_subsets


@pytest.mark.parametrize("n", [12, 40, 360, 10_000])
@pytest.mark.parametrize("seed", [0, 3])
def test_roles_are_disjoint_by_construction(n, seed):
    s = draw_subsets(n, val=512, test=512, calib=64, seed=seed)
    val, test, calib = set(s.val.tolist()), set(s.test.tolist()), set(s.calib.tolist())
    assert not (val & test) and not (val & calib) and not (test & calib)
    assert all(0 <= i < n for i in val | test | calib)
    assert len(val) == len(s.val) and len(test) == len(s.test) and len(calib) == len(s.calib)
    assert s.test.size >= min(512, n // 2) and s.val.size > 0 and s.calib.size > 0


def test_large_split_gets_what_was_asked_and_the_validation_draw_is_stable():
    s = draw_subsets(10_000, val=512, test=2000, calib=64, seed=0)
    assert (s.val.size, s.test.size, s.calib.size, s.note) == (512, 2000, 64, "")
    alone = draw_subsets(10_000, val=512, seed=0)  # what `evaluate --subset 512` draws
    assert np.array_equal(alone.val, s.val) and alone.test.size == alone.calib.size == 0


def test_a_small_split_gives_test_half_and_says_so():
    s = draw_subsets(360, val=512, test=512, calib=0, seed=0)
    assert (s.val.size, s.test.size) == (180, 180) and "validation (of 512 asked)" in s.note


def test_other_splits_supply_test_and_calibration():
    s = draw_subsets(100, val=80, test=50, calib=30, seed=0, test_rows=1000, calib_rows=500)
    assert s.val.size == 80 and s.test.size == 50 and s.calib.size == 30
    assert s.test.max() < 1000 and s.calib.max() < 500


def test_the_trial_slice_is_a_seeded_quarter_of_validation_within_bounds():
    from profiling_agent.tools.data.subsets import TRIAL_MAX, TRIAL_MIN, trial_rows, trial_size

    assert trial_size(512) == 128 and trial_size(4096) == TRIAL_MAX and trial_size(180) == TRIAL_MIN == 128
    assert trial_size(20) == 20 and trial_size(64) == 64  # fewer validation images than the floor: all of them
    drawn = draw_subsets(1000, val=512, test=200, calib=64, seed=3)
    trial = trial_rows(drawn.val, 3)
    assert len(trial) == 128 and set(trial) <= set(drawn.val) and list(trial) == sorted(trial)
    assert not set(trial) & (set(drawn.test) | set(drawn.calib))
    assert trial.tolist() == trial_rows(drawn.val[::-1], 3).tolist()  # the same rows whatever their order
    assert trial.tolist() != trial_rows(drawn.val, 4).tolist()
