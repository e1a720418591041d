import math

import pytest

from speedrun.eval.matched_kl import at_control_kl, kl_weight, on_line


def test_the_line_runs_through_both_steps_in_log_kl():
    a, b = (0.1, 3.0), (0.4, 2.0)
    assert on_line(0.1, a, b) == pytest.approx(3.0) and on_line(0.4, a, b) == pytest.approx(2.0)
    assert on_line(0.2, a, b) == pytest.approx(2.5)  # the geometric mean of the two KLs: halfway in log KL
    assert on_line(0.2, b, a) == pytest.approx(on_line(0.2, a, b))  # the order of the steps does not matter


def test_an_arm_is_read_against_the_control_at_its_own_kl():
    a, b = (0.1, 3.0), (0.4, 2.0)
    same = at_control_kl(0.2, 2.5, a, b)  # on the control's line: no difference once the step is matched
    assert same["value"] == pytest.approx(0.0) and not same["extrapolated"]
    far = at_control_kl(0.8, 2.0, a, b)  # beyond the control's larger step: read, and flagged as an extrapolation
    assert far["value"] == pytest.approx(0.5) and far["extrapolated"] and far["weight"] == pytest.approx(1.5)
    assert kl_weight(math.sqrt(0.1 * 0.4), 0.1, 0.4) == pytest.approx(0.5)


def test_a_line_needs_two_positive_kls():
    for k_lo, k_hi in ((0.1, 0.1), (0.0, 0.4)):
        with pytest.raises(ValueError, match="two steps"):
            kl_weight(0.2, k_lo, k_hi)
