"""Textbook bubble ratios of pipeline schedules, as share of wall time, with the formula named.

GPipe fill/drain: (P-1)/(M+P-1). Interleaved 1F1B with V chunks per rank (Narayanan et al. 2021): the
bubble is (P-1)/V micro-batch times against M of work, i.e. (P-1)/(V*M+P-1) of wall time; the often-quoted
(P-1)/(V(P-1)+M) is wrong for V > 1. Continuous decode with m micro-batches in flight on P stages: each
stage idles at least max(0, 1 - m/P) of the time waiting for tokens to come round the ring.
This module knows nothing about traces; callers pass P, M, V, m.
"""

from __future__ import annotations

from ppscope.analysis.result import Theory
from ppscope.errors import InvalidConfigError

__all__ = ["decode_bubble", "gpipe_bubble", "interleaved_bubble", "theory_for"]


def _check(p: int, m: int, v: int = 1) -> None:
    if p < 1 or m < 1 or v < 1:
        raise InvalidConfigError(f"theory needs P >= 1, M >= 1, V >= 1; got P={p}, M={m}, V={v}")


def gpipe_bubble(p: int, m: int) -> float:
    """GPipe fill/drain bubble (P-1)/(M+P-1) for P stages and M micro-batches."""
    _check(p, m)
    return (p - 1) / (m + p - 1)


def interleaved_bubble(p: int, m: int, v: int) -> float:
    """Interleaved schedule with V chunks per rank: (P-1)/(V*M+P-1)."""
    _check(p, m, v)
    return (p - 1) / (v * m + p - 1)


def decode_bubble(p: int, inflight: int) -> float:
    """Lower bound for continuous decode with `inflight` micro-batches circulating: max(0, 1 - m/P)."""
    _check(p, max(inflight, 1))
    return max(0.0, 1.0 - inflight / p)


def theory_for(schedule: str, *, p: int, m: int, v: int = 1, inflight: int | None = None) -> Theory:
    """The prediction for a schedule name (`gpipe`, `interleaved`, `serve`); unknown ones predict nothing."""
    if p < 1:
        return Theory(formula="none (no stages)", bubble_ratio=None)
    if schedule == "gpipe" and m >= 1:
        return Theory(formula="GPipe (P-1)/(M+P-1)", bubble_ratio=gpipe_bubble(p, m), params={"P": p, "M": m})
    if schedule == "interleaved" and m >= 1 and v >= 1:
        return Theory(
            formula="interleaved (P-1)/(V*M+P-1)",
            bubble_ratio=interleaved_bubble(p, m, v),
            params={"P": p, "M": m, "V": v},
        )
    if schedule == "serve" and inflight is not None and inflight >= 1:
        return Theory(
            formula="continuous decode >= max(0, 1-m/P)",
            bubble_ratio=decode_bubble(p, inflight),
            params={"P": p, "m": inflight},
            note="a lower bound: imbalance, prefill and host time come on top",
        )
    known = "gpipe, interleaved, serve"
    what = f"schedule {schedule!r}" if schedule else "an unknown schedule"
    return Theory(
        formula="none",
        bubble_ratio=None,
        note=f"no formula for {what} (known: {known}; needs M >= 1, or micro-batches in flight for serve)",
    )
