"""The textbook bubble formulas, named and checked against hand-computed values."""

from __future__ import annotations

import pytest

from ppscope.analysis import decode_bubble, gpipe_bubble, interleaved_bubble, theory_for
from ppscope.errors import InvalidConfigError


def test_gpipe() -> None:
    assert gpipe_bubble(4, 1) == 3 / 4
    assert gpipe_bubble(4, 8) == 3 / 11
    assert gpipe_bubble(1, 5) == 0.0


def test_interleaved_is_not_the_often_quoted_formula() -> None:
    p, m, v = 4, 8, 2
    assert interleaved_bubble(p, m, v) == 3 / 19
    assert interleaved_bubble(p, m, v) != (p - 1) / (v * (p - 1) + m)
    assert interleaved_bubble(p, m, 1) == gpipe_bubble(p, m)


def test_decode_lower_bound() -> None:
    assert decode_bubble(4, 1) == 0.75
    assert decode_bubble(4, 4) == 0.0
    assert decode_bubble(4, 9) == 0.0


def test_theory_for_names_formula() -> None:
    t = theory_for("interleaved", p=4, m=8, v=2)
    assert t.formula == "interleaved (P-1)/(V*M+P-1)" and t.params == {"P": 4, "M": 8, "V": 2}
    assert theory_for("gpipe", p=2, m=2).formula.startswith("GPipe")
    assert theory_for("serve", p=4, m=0, inflight=2).bubble_ratio == 0.5
    unknown = theory_for("1f1b-zero", p=4, m=8)
    assert unknown.bubble_ratio is None and "gpipe" in unknown.note


def test_bad_parameters_raise() -> None:
    with pytest.raises(InvalidConfigError, match="P >= 1"):
        gpipe_bubble(0, 4)
    with pytest.raises(InvalidConfigError):
        interleaved_bubble(4, 4, 0)
