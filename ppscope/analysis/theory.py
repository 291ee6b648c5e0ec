"""Textbook bubble ratios of pipeline schedules, converted to ppscope's definition, each with its source.

ppscope's bubble ratio is Σ bubble ÷ (P × window): the idle share of the P devices' wall time over one common
window. Publications state a schedule's bubble in other forms: as idle time per device (b), or as a fraction of
the ideal compute time (b ÷ w). When every device does the same work w per step and idles the same b within
the step (true of every schedule here with balanced stages: the window is the same for all devices), the
window is w + b and the ratio is b ÷ (w + b); each function converts its source's figure that way, and says
where a figure cannot be converted exactly.

Assumptions common to all: balanced stages (each chunk of each device costs the same), free transfers, no
host time, every step ends in a flush (a decode step of gpipe inference; the optimizer step of training), so
the ratio of one step is the ratio of the run. For training, F, I and W are the times of a chunk's forward,
backward for inputs and backward for weights, and B = I + W the full backward; schedules that do not split
the backward only need F + B. Where the caller has no measured costs, F = I = W.

Which causes a formula counts: the flushed schedules' bubble is their fill and drain (every stage idles while
the pipeline fills and drains, each step); the bound for continuous decode is the `dependency` wait. The report
compares those causes with the formula and lists the others as the rest of the gap. This module knows
nothing about traces; callers pass P, M, V, m and costs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ppscope.analysis.result import Theory, TheoryGap
from ppscope.errors import ErrorCode, InvalidConfigError
from ppscope.trace.schedules import Schedule

__all__ = [
    "PassCosts",
    "decode_bubble",
    "dualpipev_bubble",
    "flushes",
    "gap_parts",
    "gpipe_bubble",
    "interleaved_bubble",
    "theory_for",
    "zb_h1_bubble",
    "zbv_bubble",
]

FILL_DRAIN = ("fill", "drain")
DEPENDENCY = ("dependency",)


@dataclass(frozen=True)
class PassCosts:
    """Times of one chunk's passes on one micro-batch, in any unit (only their ratios matter)."""

    f: float = 1.0
    """Forward."""
    i: float = 1.0
    """Backward for the inputs (the zero-bubble paper's B)."""
    w: float = 1.0
    """Backward for the weights."""

    def __post_init__(self) -> None:
        if min(self.f, self.i, self.w) < 0 or self.f + self.i + self.w <= 0:
            raise InvalidConfigError(
                ErrorCode.BAD_VALUE, f"pass costs must be >= 0 and not all 0, got F={self.f} I={self.i} W={self.w}"
            )

    @property
    def b(self) -> float:
        """The full backward, I + W."""
        return self.i + self.w

    @property
    def equal(self) -> bool:
        return self.f == self.i == self.w


def _check(p: int, m: int, v: int = 1) -> None:
    if p < 1 or m < 1 or v < 1:
        raise InvalidConfigError(ErrorCode.BAD_VALUE, f"theory needs P >= 1, M >= 1, V >= 1; got P={p}, M={m}, V={v}")


def _ratio(bubble: float, work: float) -> float:
    """Idle b per device and work w per device, in one window w + b: b ÷ (w + b)."""
    return bubble / (work + bubble) if bubble > 0 else 0.0


def flushes(schedule: str) -> bool:
    """Whether every step of `schedule` ends in a flush (`Schedule.flushed`: ppscope's gpipe and interleaved
    inference, and every training schedule; `serve` circulates without one); False for a name ppscope does
    not know."""
    known = Schedule.named(schedule)
    return known is not None and known.flushed


def gpipe_bubble(p: int, m: int) -> float:
    """(P-1)/(M+P-1): GPipe, and 1F1B, with P stages and M micro-batches.

    GPipe (Huang et al. 2019, "GPipe: efficient training of giant neural networks using pipeline
    parallelism"): the bubble is O((P-1)/(M+P-1)) of the step, each device idle for P-1 of M+P-1 stage times
    in the forward wave and again in the backward one. 1F1B (PipeDream-Flush; Narayanan et al. 2021,
    "Efficient large-scale language model training on GPU clusters using Megatron-LM", section 2.2.1) has the
    same bubble, b = (P-1)(F+B) against w = M(F+B); the paper's "bubble time fraction" (P-1)/M is b ÷ w, which
    is (P-1)/(M+P-1) as b ÷ (w + b). Forward-only inference (ppscope's gpipe) is the same with B = 0.
    """
    _check(p, m)
    return _ratio(p - 1, m)


def interleaved_bubble(p: int, m: int, v: int) -> float:
    """(P-1)/(V*M+P-1): interleaved 1F1B, and looped breadth-first, with V chunks per device.

    Interleaved 1F1B (Narayanan et al. 2021, section 2.2.2): b = (P-1)(F+B)/V per device, the paper's fraction
    (P-1)/(V*M) of the ideal time, hence (P-1)/(V*M+P-1) of the window (the often-quoted (P-1)/(V(P-1)+M) is
    wrong for V > 1). Assumes M a multiple of P, as Megatron-LM requires; torch's ScheduleInterleaved1F1B
    takes other M and then idles more. ppscope's forward-only `interleaved` is the same with B = 0.

    Looped breadth-first (Lamy-Poirier 2023, "Breadth-first pipeline parallelism"; torch's
    ScheduleLoopedBFS, which runs every forward chunk by chunk, then every backward in reverse): derived here,
    not quoted. With M >= P the ring never starves a device inside a loop, device r starts its forwards r
    chunk-forwards after device 0 and its backwards (P-1-r) chunk-backwards after the last device, so each
    device idles (P-1)(F+B)/V in a window of (V*M+P-1)(F+B)/V: the same ratio.
    """
    _check(p, m, v)
    return _ratio(p - 1, v * m)


def zb_h1_bubble(p: int, m: int, costs: PassCosts = PassCosts()) -> float:
    """ZB-H1: b = (P-1)(F+I-W) = (P-1)(F+B-2W) against w = M(F+I+W); (P-1)/(3M+P-1) when F = I = W.

    Qi et al. 2024, "Zero bubble pipeline parallelism" (ICLR 2024), section 2.1: ZB-H1 is 1F1B with the
    weight gradients W delayed into the cool-down, at 1F1B's peak memory, and its bubble is
    (P-1)(T_F + T_B - T_W), their T_B being the backward for inputs (I here). DeepSeek's DualPipe README writes
    the same as (PP-1)(F+B-2W) with B the full backward ("ZB1P"). The paper derives the schedule with
    T_F = T_B = T_W, where it is a third of 1F1B's bubble; for other costs the expression is quoted as published.
    One stage per device (V = 1).
    """
    _check(p, m)
    return _ratio((p - 1) * max(costs.f + costs.i - costs.w, 0.0), m * (costs.f + costs.b))


def zbv_bubble(p: int, m: int, costs: PassCosts = PassCosts()) -> float:
    """ZBV: at least (P-1)F against w = 2M(F+I+W); (P-1)/(6M+P-1) when F = I = W. Not the published figure.

    Published: Qi et al. 2024 (section 6, ZB-V) and the zero-bubble repository (sail-sg/
    zero-bubble-pipeline-parallelism) give ZBV a bubble rate of 0 when T_F = T_B = T_W, with two chunks per
    device in a V (device r holds chunks r and 2P-1-r). That rate is taken over each device's own time, from
    its first pass to its last ("1 - (F+B+W)*M / longest stage time"), and cannot be stated exactly in ppscope's
    definition, whose window is common to all devices: device r cannot start before chunk r's first forward
    reached it, r chunk-forwards after device 0. Reading the published 0 as "once started, no device idles",
    every device idles (P-1)F of the common window (device r, rF before its start and (P-1-r)F after its end):
    that is what this returns, and it is also the least any schedule with this placement can idle.
    """
    _check(p, m)
    return _ratio((p - 1) * costs.f, 2 * m * (costs.f + costs.b))


def dualpipev_bubble(p: int, m: int, costs: PassCosts = PassCosts()) -> float:
    """DualPipeV: b = (P-1)(F&B+B-3W) with F&B = F+B, against w = 2M(F+B); (P-1)/(3M+P-1) when F = I = W.

    Published: DeepSeek's DualPipe README (github.com/deepseek-ai/DualPipe, "Pipeline bubbles and memory
    usage comparison"; DualPipe is from the DeepSeek-V3 technical report, 2024) gives DualPipeV, the V-shaped
    "cut-in-half" DualPipe, the bubble (PP/2-1)(F&B+B-3W) for PP stages on PP/2 devices: P = PP/2 devices of
    two chunks each here, so b = (P-1)(F&B+B-3W) per device, F, B and W per chunk and F&B the time of a forward
    and a backward run overlapped. The README gives no step length, and the window depends on how many pairs
    overlap, so the published figure cannot be stated exactly in ppscope's definition. Stated here with
    F&B = F + B (no overlap gain: a CPU run, or communication too cheap to hide), where each device works
    2M(F+B) and b is taken as its idle time within the step, as the README's 1F1B row (PP-1)(F+B) is.
    """
    _check(p, m)
    return _ratio((p - 1) * max(costs.f + 2 * costs.b - 3 * costs.w, 0.0), 2 * m * (costs.f + costs.b))


def decode_bubble(p: int, inflight: int) -> float:
    """Lower bound for continuous decode with m = `inflight` micro-batches circulating: max(0, 1 - m/P).

    A micro-batch's next pass waits for its own token from the last stage, so each stage works at most m of
    every P stage times (steady state; imbalance, prefill and host time come on top).
    """
    _check(p, max(inflight, 1))
    return max(0.0, 1.0 - inflight / p)


_Build = Callable[[int, int, int, PassCosts], tuple[str, float, str]]


def _costs_note(costs: PassCosts) -> str:
    if costs.equal:
        return "F = I = W assumed"
    return f"F={costs.f:g}, I={costs.i:g}, W={costs.w:g}"


_FORMULAS: dict[Schedule, tuple[_Build, bool]] = {
    # schedule -> (builder, needs V > 1); each returns (formula, ratio, note)
    Schedule.GPIPE: (lambda p, m, v, c: ("GPipe (P-1)/(M+P-1)", gpipe_bubble(p, m), ""), False),
    Schedule.ONE_F_ONE_B: (lambda p, m, v, c: ("1F1B (P-1)/(M+P-1)", gpipe_bubble(p, m), ""), False),
    Schedule.INTERLEAVED: (
        lambda p, m, v, c: ("interleaved (P-1)/(V*M+P-1)", interleaved_bubble(p, m, v), ""),
        True,
    ),
    Schedule.INTERLEAVED_1F1B: (
        lambda p, m, v, c: ("interleaved 1F1B (P-1)/(V*M+P-1)", interleaved_bubble(p, m, v), ""),
        True,
    ),
    Schedule.LOOPED_BFS: (
        lambda p, m, v, c: ("looped BFS (P-1)/(V*M+P-1)", interleaved_bubble(p, m, v), "needs M >= P"),
        True,
    ),
    Schedule.ZERO_BUBBLE: (
        lambda p, m, v, c: ("ZB-H1 (P-1)(F+B-2W) of M(F+B)", zb_h1_bubble(p, m, c), _costs_note(c)),
        False,
    ),
    Schedule.ZBV: (
        lambda p, m, v, c: (
            "ZBV >= (P-1)F of 2M(F+B)",
            zbv_bubble(p, m, c),
            f"published as 0 over each device's own time; the common window adds the first forward's fill "
            f"({_costs_note(c)})",
        ),
        False,
    ),
    Schedule.DUALPIPEV: (
        lambda p, m, v, c: (
            "DualPipeV (P-1)(F&B+B-3W) of 2M(F+B)",
            dualpipev_bubble(p, m, c),
            "with F&B = F+B (no overlap gain; DeepSeek's DualPipe README, github.com/deepseek-ai/DualPipe, gives no "
            f"step length) ({_costs_note(c)})",
        ),
        False,
    ),
}


def theory_for(
    schedule: str, *, p: int, m: int, v: int = 1, inflight: int | None = None, costs: PassCosts | None = None
) -> Theory:
    """The prediction for a schedule name; unknown ones, and published figures that do not apply to this shape
    (zero-bubble with V > 1), predict nothing and say why."""
    if p < 1:
        return Theory(formula="none (no stages)", bubble_ratio=None)
    costs = costs or PassCosts()
    named = Schedule.named(schedule)
    entry = _FORMULAS.get(named) if named is not None else None
    if entry is not None and m >= 1 and v >= 1:
        build, uses_v = entry
        if named is Schedule.ZERO_BUBBLE and v > 1:
            return Theory(
                formula="none",
                bubble_ratio=None,
                note=f"no published formula for zero-bubble with V={v} chunks per device (ZB-H1's is for V = 1)",
            )
        formula, ratio, note = build(p, m, v, costs)
        params = {"P": p, "M": m, **({"V": v} if uses_v else {})}
        return Theory(formula=formula, bubble_ratio=ratio, params=params, note=note, causes=FILL_DRAIN)
    if named is Schedule.SERVE and inflight is not None and inflight >= 1:
        return Theory(
            formula="continuous decode >= max(0, 1-m/P)",
            bubble_ratio=decode_bubble(p, inflight),
            params={"P": p, "m": inflight},
            note="a lower bound: imbalance, prefill and host time come on top",
            causes=DEPENDENCY,
        )
    known = ", ".join([*_FORMULAS, Schedule.SERVE])
    what = f"schedule {schedule!r}" if schedule else "an unknown schedule"
    return Theory(
        formula="none",
        bubble_ratio=None,
        note=f"no formula for {what} (known: {known}; needs M >= 1, or micro-batches in flight for serve)",
    )


def gap_parts(shares: dict[str, float], theory: Theory) -> TheoryGap | None:
    """Measured minus predicted bubble ratio in parts that add up to it: the formula's causes together against
    the formula (their share minus its ratio, either sign), then every other cause's share, in `shares`'
    order. `shares`: each cause's share of P × window; their sum is the measured bubble ratio."""
    if theory.bubble_ratio is None:
        return None
    own = [c for c in theory.causes if c in shares]
    parts = {"+".join(own) or "formula": sum(shares[c] for c in own) - theory.bubble_ratio}
    parts.update({c: v for c, v in shares.items() if c not in own and v})
    return TheoryGap(ratio=sum(shares.values()) - theory.bubble_ratio, parts=parts)
