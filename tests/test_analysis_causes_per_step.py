"""Causes follow the schedule: fill and drain per step, the first stage's wait for its token is `dependency`.

On balanced, noise-free pipelines (the simulator's schedules, and unit-time training timelines built here) the
causes are the formula's: fill + drain equal it and nothing is left for other causes.
"""

from __future__ import annotations

from typing import Any

import pytest

from ppscope.analysis import AnalysisResult, analyze, gpipe_bubble, interleaved_bubble
from ppscope.balance.costs import LayerCosts
from ppscope.simulate.simulator import SimConfig, simulate
from ppscope.trace.model import RunMeta, Trace

FILL_DRAIN = {"fill", "drain"}


def _shares(res: AnalysisResult) -> dict[str, float]:
    assert res.window is not None
    total = res.pp_size * res.window.length_ns
    return {c: sum(s.causes[c] for s in res.stages) / total for c in res.stages[0].causes}


def _sim(**kw: Any) -> AnalysisResult:
    virtual = kw["stages"] * kw.get("chunks", 1)
    return analyze(simulate(SimConfig(costs=LayerCosts.uniform(2 * virtual, 1.0), **kw)))


@pytest.mark.parametrize(
    "kw",
    [
        dict(schedule="gpipe", stages=4, microbatches=8, steps=3),  # the example
        dict(schedule="gpipe", stages=4, microbatches=2, steps=3),  # fewer micro-batches than stages
        dict(schedule="gpipe", stages=4, microbatches=1, steps=4),
        dict(schedule="gpipe", stages=3, microbatches=5, steps=2, prefill_factor=3.0),  # steps of unequal length
        dict(schedule="gpipe", stages=2, microbatches=3, steps=1),
        dict(schedule="interleaved", stages=4, microbatches=8, chunks=2, steps=3),
        dict(schedule="interleaved", stages=2, microbatches=4, chunks=3, steps=2, prefill_factor=2.0),
    ],
    ids=lambda kw: "-".join(f"{v}" for v in kw.values()),
)
def test_balanced_flushed_schedules_are_fill_and_drain_only(kw: dict[str, Any]) -> None:
    res = _sim(**kw)
    p, m, v = kw["stages"], kw["microbatches"], kw.get("chunks", 1)
    expected = gpipe_bubble(p, m) if kw["schedule"] == "gpipe" else interleaved_bubble(p, m, v)
    assert res.theory.bubble_ratio == pytest.approx(expected) and res.theory.causes == ("fill", "drain")
    shares = _shares(res)
    assert shares["fill"] + shares["drain"] == pytest.approx(expected, abs=1e-12)
    assert {c for c, x in shares.items() if x} <= FILL_DRAIN
    assert res.theory_gap is not None and res.theory_gap.parts == {"fill+drain": pytest.approx(0, abs=1e-12)}
    for s in res.stages:  # every stage fills and drains as much as any other: (P-1) of M+P-1 per step
        assert s.causes["fill"] + s.causes["drain"] == res.stages[0].causes["fill"] + res.stages[0].causes["drain"]


def test_gpipe_step_boundary_splits_at_the_pipelines_end_of_step() -> None:
    # 4 stages of 1 ms, 8 micro-batches, 3 steps: stage s drains P-1-s ms and fills s ms at every flush
    res = _sim(schedule="gpipe", stages=4, microbatches=8, steps=3)
    unit = 2_000_000  # two layers of 1 ms per stage
    for s in res.stages:
        assert (s.causes["fill"], s.causes["drain"]) == (3 * s.stage * unit, 3 * (3 - s.stage) * unit)


@pytest.mark.parametrize(("m", "steps"), [(1, 5), (2, 5), (3, 4), (4, 3), (6, 3)])
def test_balanced_serve_waits_are_dependency_only(m: int, steps: int) -> None:
    p = 4
    res = _sim(schedule="serve", stages=p, microbatches=m, steps=steps)
    assert res.theory.causes == ("dependency",)
    shares = _shares(res)
    assert {c for c, x in shares.items() if x} <= {"fill", "drain", "dependency"}
    # one fill and one drain per run; each stage works m of every P stage times once the ring has filled
    window = p * steps + m - 1 if m <= p else m * steps + p - 1
    assert shares["fill"] + shares["drain"] == pytest.approx((p - 1) / window)
    assert shares["dependency"] == pytest.approx(max(p - m, 0) * (steps - 1) / window)


def test_first_stage_waiting_for_its_token_is_dependency_in_every_schedule() -> None:
    # As many in flight as stages, but a slow last stage: the first stage waits for the token of the micro-batch
    # it runs next (dependency), the others wait for a slower predecessor (upstream)
    res = _sim(schedule="serve", stages=4, microbatches=4, steps=4, speed=(1.0, 1.0, 1.0, 0.5))
    first, *rest = res.stages
    assert first.causes["dependency"] > 0 and first.causes["upstream"] == 0
    assert all(s.causes["dependency"] == 0 for s in rest) and sum(s.causes["upstream"] for s in rest) > 0
    # the engine labels the wait for a prefill's token with the prefill: still the token's dependency
    rows = [
        dict(rank=0, stage=0, kind="forward", start_ns=0, end_ns=10, mb=0, step=0, phase="prefill"),
        dict(rank=0, stage=0, kind="recv_wait", start_ns=10, end_ns=30, mb=0, step=0, phase="prefill", peer=1),
        dict(rank=0, stage=0, kind="forward", start_ns=30, end_ns=40, mb=0, step=1, phase="decode"),
        dict(rank=1, stage=1, kind="recv_wait", start_ns=0, end_ns=10, mb=0, step=0, phase="prefill", peer=0),
        dict(rank=1, stage=1, kind="forward", start_ns=10, end_ns=30, mb=0, step=0, phase="prefill"),
        dict(rank=1, stage=1, kind="recv_wait", start_ns=30, end_ns=40, mb=0, step=1, phase="decode", peer=0),
        dict(rank=1, stage=1, kind="forward", start_ns=40, end_ns=50, mb=0, step=1, phase="decode"),
    ]
    meta = RunMeta(schedule="serve", world_size=2, pp_size=2, config={"max_inflight": 2})
    engine = analyze(Trace.from_records(rows, meta=meta))
    assert engine.stage(0).causes["dependency"] == 20 and engine.stage(0).causes["upstream"] == 0
    assert engine.stage(1).causes["upstream"] == 10  # two in flight on two stages: not bound by the ring


def test_without_a_flush_fill_and_drain_happen_once() -> None:
    # serve circulates without a flush: idle time between steps keeps its span's cause
    res = _sim(schedule="serve", stages=2, microbatches=1, steps=3)
    s1 = res.stage(1)
    assert s1.causes["fill"] == 2_000_000 and s1.causes["dependency"] == 2 * 2_000_000


# --------------------------------------------------------------------------- training timelines, unit costs


def _training(p: int, m: int, order: str, steps: int = 1, slow_last_backward: bool = False) -> Trace:
    """Training steps (F = B = 2 time units, free transfers) with torch-like action orders: `gpipe` (every
    forward, then every backward) or `1f1b`; a flush between steps. Backward passes have phase `backward`;
    waits are `recv_wait` spans, as an importer of such a run records them. `slow_last_backward`: the last
    stage's backward takes 3 units."""
    rows: list[dict[str, Any]] = []
    t0 = 0
    for step in range(steps):
        orders = []
        for r in range(p):
            fwd, bwd = [("F", i) for i in range(m)], [("B", i) for i in range(m)]
            if order == "gpipe":
                orders.append(fwd + bwd)
                continue
            warm = min(p - 1 - r, m)
            seq = fwd[:warm]
            for i in range(m - warm):
                seq += [fwd[warm + i], bwd[i]]
            orders.append(seq + bwd[m - warm :])
        done: dict[tuple[str, int, int], int] = {}
        free, pos = [t0] * p, [0] * p
        while any(pos[r] < len(orders[r]) for r in range(p)):
            for r in range(p):
                while pos[r] < len(orders[r]):
                    kind, i = orders[r][pos[r]]
                    dep = (("F", r - 1, i) if r else None) if kind == "F" else ("B", r + 1, i) if r < p - 1 else None
                    deps = [d for d in (dep, ("F", r, i) if kind == "B" else None) if d is not None]
                    if any(d not in done for d in deps):
                        break
                    start = max([free[r], *(done[d] for d in deps)])
                    if start > free[r]:
                        peer = r - 1 if kind == "F" else r + 1
                        rows.append(_span(r, "recv_wait", free[r], start, i, step, kind, peer=peer))
                    cost = 3 if slow_last_backward and kind == "B" and r == p - 1 else 2
                    rows.append(_span(r, "forward", start, start + cost, i, step, kind))
                    done[(kind, r, i)] = free[r] = start + cost
                    pos[r] += 1
        t0 = max(free)
    meta = RunMeta(schedule=order, world_size=p, pp_size=p, microbatches=m, source="unknown")
    return Trace.from_records(rows, meta=meta)


def _span(r: int, kind: str, start: int, end: int, mb: int, step: int, action: str, peer: int = -1) -> dict[str, Any]:
    unit = 500_000
    phase = "backward" if action == "B" else ""
    return dict(
        rank=r,
        stage=r,
        kind=kind,
        start_ns=start * unit,
        end_ns=end * unit,
        mb=mb,
        step=step,
        phase=phase,
        peer=peer,
        name=f"{action}{mb}",
    )


@pytest.mark.parametrize("order", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m", "steps"), [(4, 8, 1), (4, 4, 2), (3, 2, 2), (2, 5, 3)])
def test_training_warm_up_and_cool_down_are_fill_and_drain(order: str, p: int, m: int, steps: int) -> None:
    res = analyze(_training(p, m, order, steps))
    shares = _shares(res)
    assert res.bubble_ratio == pytest.approx(gpipe_bubble(p, m))  # the timeline is the textbook one
    assert res.theory.bubble_ratio == pytest.approx(gpipe_bubble(p, m))
    assert shares["fill"] + shares["drain"] == pytest.approx(gpipe_bubble(p, m), abs=1e-12)
    assert {c for c, x in shares.items() if x} <= FILL_DRAIN


def test_training_steady_state_waits_keep_their_cause() -> None:
    # a slow last stage makes 1F1B's first stage wait for gradients between its warm-up and its cool-down too
    res = analyze(_training(2, 4, "1f1b", slow_last_backward=True))
    first = res.stage(0)
    assert first.causes["fill"] > 0 and first.causes["drain"] > 0
    # the steady state's waits are for the slower next stage's gradients: downstream, not fill or drain
    assert first.causes["downstream"] > 0 and first.causes["upstream"] == 0


def test_gpipe_training_gap_is_the_forward_drain_then_the_backward_fill() -> None:
    # P=3, M=2, F=B=2 units: stage 0 ends its forwards at 4, the forward wave leaves the pipeline at 8, the
    # backward wave reaches stage 0 at 12: [4, 8) is the forward wave's drain, [8, 12) the backward wave's fill
    res = analyze(_training(3, 2, "gpipe"))
    unit = 500_000
    gaps = res.gaps[res.gaps["stage"] == 0]
    got = [
        (int(s) // unit, int(e) // unit, str(c))
        for s, e, c in gaps[["start_ns", "end_ns", "cause"]].itertuples(index=False)
    ]
    assert got == [(4, 8, "drain"), (8, 12, "fill")]
