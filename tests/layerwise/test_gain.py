import math

import pytest

from precision_doctor.layerwise.compare import LayerRecord
from precision_doctor.layerwise.gain import largest_jump, local_gains, nonfinite_birth, top_gains

U = 2.0 ** -11  # FP16 unit roundoff


def rec(tensor, index, rel_l2, nan=0, inf=0, overflow=0, ref_bad=0):
    return LayerRecord(tensor, f"n_{tensor}", "Op", index, 10, 1.0, 1.0, 0.0, 0.0, rel_l2, nan,
                       inf, ref_bad, overflow, 0, 0, 0, 1.0)


CHAIN = {"b": ["a"], "c": ["b"], "d": ["c", "a"]}


def test_gain_is_error_over_input_error_floored_at_unit_roundoff():
    records = [rec("a", 0, 1e-5), rec("b", 1, 1e-3), rec("c", 2, 2e-1), rec("d", 3, 2e-1)]
    gains = {g.record.tensor: g for g in local_gains(records, CHAIN, U)}
    assert gains["a"].gain == pytest.approx(1e-5 / U)  # no compared inputs: floor u
    assert gains["b"].gain == pytest.approx(1e-3 / U)  # input error 1e-5 < u: floor u
    assert gains["c"].gain == pytest.approx(200.0)
    assert gains["d"].input_rel_l2 == pytest.approx(2e-1)  # the largest input error
    assert gains["d"].gain == pytest.approx(1.0)


def test_largest_jump_is_the_biggest_gain_above_threshold_not_the_first_crossing():
    records = [rec("a", 0, 2e-2), rec("b", 1, 3e-2), rec("c", 2, 3.0), rec("d", 3, 3.0)]
    jump = largest_jump(records, CHAIN, U, threshold=1e-2)
    assert jump.record.tensor == "c" and jump.gain == pytest.approx(100.0)
    assert largest_jump(records, CHAIN, U, threshold=10.0) is None
    assert [g.record.tensor for g in top_gains(records, CHAIN, U, 1e-2, 2)] == ["c", "a"]


def test_inf_birth_wins_and_inherited_inf_has_no_gain():
    records = [rec("a", 0, 1e-3), rec("b", 1, math.inf, inf=3, overflow=3),
               rec("c", 2, math.inf, nan=3), rec("d", 3, math.inf, nan=3)]
    gains = {g.record.tensor: g for g in local_gains(records, CHAIN, U)}
    assert gains["b"].born_nonfinite and gains["b"].gain == math.inf
    assert gains["b"].sensitivity == math.inf and gains["b"].overflow
    assert not gains["c"].born_nonfinite and gains["c"].gain == 0.0
    assert nonfinite_birth(records, CHAIN).tensor == "b"
    assert largest_jump(records, CHAIN, U, 1e-2).record.tensor == "b"


def test_reference_nonfinite_is_not_a_birth():
    records = [rec("a", 0, 0.0), rec("b", 1, math.inf, inf=1, ref_bad=1)]
    assert nonfinite_birth(records, CHAIN) is None


def test_a_birth_measured_harmless_is_skipped():
    records = [rec("a", 0, 1e-3), rec("b", 1, math.inf, inf=3, overflow=3), rec("c", 2, 0.5),
               rec("d", 3, 0.5)]
    assert largest_jump(records, CHAIN, U, 1e-2).record.tensor == "b"
    jump = largest_jump(records, CHAIN, U, 1e-2, harmless={"n_b"})
    # c computes a finite value from b's Inf: it absorbs the upstream event (gain 0), it does
    # not amplify rounding; d carries c's error on (gain 1)
    assert jump.record.tensor == "d" and jump.gain == pytest.approx(1.0)

