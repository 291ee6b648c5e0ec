"""The textbook bubble formulas, named and checked against hand-computed values."""

from __future__ import annotations

import pytest
from error_helpers import raises_code

from ppscope.analysis import (
    PassCosts,
    decode_bubble,
    dualpipev_bubble,
    gpipe_bubble,
    interleaved_bubble,
    theory_for,
    zb_h1_bubble,
    zbv_bubble,
)
from ppscope.analysis.theory import flushes, gap_parts
from ppscope.errors import ErrorCode, InvalidConfigError


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
    with raises_code(InvalidConfigError, ErrorCode.BAD_VALUE):
        gpipe_bubble(0, 4)
    with pytest.raises(InvalidConfigError):
        interleaved_bubble(4, 4, 0)


def test_training_schedules_in_ppscopes_definition() -> None:
    p, m = 4, 8
    assert theory_for("1f1b", p=p, m=m).bubble_ratio == gpipe_bubble(p, m) == 3 / 11
    assert theory_for("interleaved-1f1b", p=p, m=m, v=2).bubble_ratio == interleaved_bubble(p, m, 2) == 3 / 19
    assert theory_for("looped-bfs", p=p, m=m, v=2).bubble_ratio == 3 / 19
    # ZB-H1: (P-1)(F+B-2W) idle against M(F+B) of work, B = I + W; (P-1)/(3M+P-1) when F = I = W
    assert zb_h1_bubble(p, m) == 3 / 27 and theory_for("zero-bubble", p=p, m=m).bubble_ratio == 3 / 27
    costs = PassCosts(f=2.0, i=1.5, w=1.0)  # b = 3 * (2 + 2.5 - 2) = 7.5 against w = 8 * 4.5 = 36
    assert zb_h1_bubble(p, m, costs) == pytest.approx(7.5 / 43.5)
    # ZBV: published as 0 over each device's own time; the common window keeps the first forward's fill
    assert zbv_bubble(p, m) == 3 / 51 and zbv_bubble(1, m) == 0.0
    assert zbv_bubble(p, m, costs) == pytest.approx(6 / (2 * 8 * 4.5 + 6))
    # DualPipeV, F&B = F + B: (P-1)(F+2B-3W) against 2M(F+B); (P-1)/(3M+P-1) when F = I = W
    assert dualpipev_bubble(p, m) == pytest.approx(3 / 27)
    assert dualpipev_bubble(p, m, costs) == pytest.approx(3 * 4 / (2 * 8 * 4.5 + 12))
    for name in ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zero-bubble", "zbv", "dualpipev"):
        t = theory_for(name, p=p, m=m, v=2 if name in ("interleaved-1f1b", "looped-bfs") else 1)
        assert t.bubble_ratio is not None and t.causes == ("fill", "drain"), name
        assert flushes(name)
    assert not flushes("serve") and theory_for("serve", p=4, m=0, inflight=2).causes == ("dependency",)


def test_published_figures_that_do_not_convert_say_so() -> None:
    zbv = theory_for("zbv", p=4, m=8)
    assert "published as 0" in zbv.note and "F = I = W assumed" in zbv.note
    assert "F&B = F+B" in theory_for("dualpipev", p=4, m=8).note
    interleaved_zb = theory_for("zero-bubble", p=4, m=8, v=2)
    assert interleaved_zb.bubble_ratio is None and "V = 1" in interleaved_zb.note
    with raises_code(InvalidConfigError, ErrorCode.BAD_VALUE):
        PassCosts(f=-1.0)


def test_gap_parts_add_up_with_their_signs() -> None:
    serve = theory_for("serve", p=4, m=0, inflight=2)
    shares = {"fill": 0.01, "drain": 0.04, "upstream": 0.06, "dependency": 0.45, "host": 0.0}
    gap = gap_parts(shares, serve)
    assert gap is not None and gap.ratio == pytest.approx(sum(shares.values()) - 0.5)
    assert gap.parts == {"dependency": pytest.approx(-0.05), "fill": 0.01, "drain": 0.04, "upstream": 0.06}
    assert sum(gap.parts.values()) == pytest.approx(gap.ratio)
    gpipe = gap_parts({"fill": 0.2, "drain": 0.1, "comm": 0.05}, theory_for("gpipe", p=4, m=8))
    assert gpipe is not None and list(gpipe.parts) == ["fill+drain", "comm"]
    assert gpipe.parts["fill+drain"] == pytest.approx(0.3 - 3 / 11)
    assert gap_parts(shares, theory_for("", p=4, m=8)) is None
