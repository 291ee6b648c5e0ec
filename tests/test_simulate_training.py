"""The replay of a training pipeline's own action order (`ppscope.simulate.training`): with equal costs and
free hops each schedule's order gives its published bubble exactly (torch 2.13's own `pipeline_order`, and
orders built here); unequal costs give the hand-computed figure; a run's actions, costs and steps are read
from its spans; bad input is a one-line note, never a traceback."""

from __future__ import annotations

import dataclasses
import json
import types
from collections.abc import Callable
from pathlib import Path

import pytest
from error_helpers import raises_code

from ppscope.analysis import (
    analyze,
    dualpipev_bubble,
    gpipe_bubble,
    interleaved_bubble,
    zb_h1_bubble,
    zbv_bubble,
)
from ppscope.analysis.report import render_text
from ppscope.cli.main import main
from ppscope.errors import ErrorCode, InvalidConfigError
from ppscope.simulate.simulator import write_run
from ppscope.simulate.training import MAX_STEPS, replay_order, replay_training, training_actions
from ppscope.trace.actions import Action, ActionType
from ppscope.trace.model import RankInfo, RunMeta, Trace
from ppscope.trace.store import load_run

EQUAL = {"F": 1000, "B": 2000, "I": 1000, "W": 1000}
"""F = I = W, B = I + W."""


def _act(stage: int, kind: str, mb: int) -> Action:
    """Action `{stage}{kind}{mb}`: `_act(2, "F", 0)` is 2F0."""
    return Action(stage, ActionType(kind), mb)


def _costs(stages: int, per_type: dict[str, int] = EQUAL) -> dict[tuple[int, str], int]:
    return {(s, t): c for s in range(stages) for t, c in per_type.items()}


def _gpipe(p: int, m: int) -> dict[int, list[Action]]:
    return {r: [_act(r, "F", i) for i in range(m)] + [_act(r, "B", i) for i in range(m)] for r in range(p)}


def _one_f_one_b(p: int, m: int) -> dict[int, list[Action]]:
    """PipeDream-Flush: rank r runs P-1-r forwards, then one forward and one backward in turn, then the rest."""
    out = {}
    for r in range(p):
        warm = min(p - 1 - r, m)
        acts = [_act(r, "F", i) for i in range(warm)]
        for i in range(m - warm):
            acts += [_act(r, "F", warm + i), _act(r, "B", i)]
        acts += [_act(r, "B", i) for i in range(m - warm, m)]
        out[r] = acts
    return out


def _zb_h1(p: int, m: int) -> dict[int, list[Action]]:
    """ZB-H1 (Qi et al. 2024): 1F1B with the backward split into I and W, rank r running P-r forwards ahead and
    delaying each W by r micro-batches, so that rank 0's cool-down is filled (torch's order for V = 1)."""
    out = {}
    for r in range(p):
        warm = min(p - r, m)
        acts = [_act(r, "F", i) for i in range(warm)]
        for i in range(m):
            acts.append(_act(r, "I", i))
            if i >= r:
                acts.append(_act(r, "W", i - r))
            if warm + i < m:
                acts.append(_act(r, "F", warm + i))
        acts += [_act(r, "W", j) for j in range(max(m - r, 0), m)]
        out[r] = acts
    return out


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 4), (3, 7)])
def test_equal_costs_give_the_published_bubble(p: int, m: int) -> None:
    assert replay_order(_gpipe(p, m), _costs(p)).bubble_ratio == pytest.approx(gpipe_bubble(p, m), abs=1e-12)
    assert replay_order(_one_f_one_b(p, m), _costs(p)).bubble_ratio == pytest.approx(gpipe_bubble(p, m), abs=1e-12)
    assert replay_order(_zb_h1(p, m), _costs(p)).bubble_ratio == pytest.approx(zb_h1_bubble(p, m), abs=1e-12)
    assert zb_h1_bubble(p, m) == pytest.approx((p - 1) / (3 * m + p - 1))


def _torch_order(cls_name: str, p: int, v: int, m: int) -> dict[int, list[Action]]:
    """torch's own `pipeline_order` (compute actions only, paired ones in their parts' order); the stages are
    stand-ins with the fields the schedules read to plan (rank 0's: stage c*P of a loop, or 0 and 2P-1 of a V)."""
    torch = pytest.importorskip("torch")
    from torch.distributed.pipelining import schedules

    held = [0, 2 * p - 1] if cls_name in ("ScheduleZBVZeroBubble", "ScheduleDualPipeV") else [c * p for c in range(v)]
    stages = [
        types.SimpleNamespace(
            num_stages=p * v,
            group_size=p,
            group_rank=0,
            stage_index=s,
            is_first=s == 0,
            is_last=s == p * v - 1,
            stage_index_to_group_rank=None,
            submod=torch.nn.Linear(1, 1),
        )
        for s in held
    ]
    cls = getattr(schedules, cls_name)
    single = cls_name in ("ScheduleGPipe", "Schedule1F1B")
    sched = cls(stages[0] if single else stages, n_microbatches=m)
    order = {}
    for r, acts in sched.pipeline_order.items():
        parts = [p for a in acts if a is not None for p in (a.sub_actions or (a,))]
        compute = [a for a in parts if a.computation_type.value in ("F", "B", "I", "W")]
        order[int(r)] = [_act(int(a.stage_index), a.computation_type.value, int(a.microbatch_index)) for a in compute]
    if cls_name == "Schedule1F1B":  # torch's plan for its last rank numbers forwards one too high; it runs F0 first
        last = p - 1
        order[last] = [dataclasses.replace(a, mb=a.mb - 1) if a.type == "F" else a for a in order[last]]
    return order


@pytest.mark.parametrize(
    ("cls_name", "v", "formula"),
    [
        ("ScheduleGPipe", 1, lambda p, m: gpipe_bubble(p, m)),
        ("Schedule1F1B", 1, lambda p, m: gpipe_bubble(p, m)),
        ("ScheduleInterleaved1F1B", 2, lambda p, m: interleaved_bubble(p, m, 2)),
        ("ScheduleLoopedBFS", 2, lambda p, m: interleaved_bubble(p, m, 2)),
        ("ScheduleInterleavedZeroBubble", 1, lambda p, m: zb_h1_bubble(p, m)),
        # no overlap gain on a replay: ZBV's (P-1)/(6M+P-1), under the DualPipe README's bound for DualPipeV
        ("ScheduleZBVZeroBubble", 2, lambda p, m: zbv_bubble(p, m)),
        ("ScheduleDualPipeV", 2, lambda p, m: zbv_bubble(p, m)),
    ],
)
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (3, 6)])
def test_torchs_own_orders_give_the_published_bubble(
    cls_name: str, v: int, formula: Callable[[int, int], float], p: int, m: int
) -> None:
    order = _torch_order(cls_name, p, v, m)
    assert replay_order(order, _costs(p * v)).bubble_ratio == pytest.approx(formula(p, m), abs=1e-12)
    if cls_name == "ScheduleDualPipeV":
        assert zbv_bubble(p, m) < dualpipev_bubble(p, m)


def test_unequal_costs_and_a_hop_give_the_hand_computed_step() -> None:
    # GPipe, P=2, M=2: F costs 1 and 2, B 3 and 4 (stage 0, stage 1), a hop 1. Rank 1 runs F0 [2,4), F1 [4,6),
    # B0 [6,10), B1 [10,14); rank 0 F0 [0,1), F1 [1,2), B0 from 10+1 to 14, B1 from 14+1 to 18.
    cost = {(0, "F"): 1, (1, "F"): 2, (0, "B"): 3, (1, "B"): 4}
    step = replay_order(_gpipe(2, 2), cost, hop_ns=1)
    times = {(t.rank, str(t.action)): (t.start_ns, t.end_ns) for t in step.actions}
    assert times[(1, "1F0")] == (2, 4) and times[(1, "1B1")] == (10, 14)
    assert times[(0, "0B0")] == (11, 14) and times[(0, "0B1")] == (15, 18)
    assert (step.window_ns, step.busy_ns) == (18, {0: 8, 1: 12})
    assert step.bubble_ratio == pytest.approx(16 / 36)
    # each link its own latency: 0→1 adds 1, 1→0 adds 3. Rank 1 as before; rank 0's B0 from 10+3 to 16, B1
    # from 14+3 to 20
    step = replay_order(_gpipe(2, 2), cost, hop_ns=1, link_ns={(1, 0): 3})
    times = {(t.rank, str(t.action)): (t.start_ns, t.end_ns) for t in step.actions}
    assert times[(1, "1F0")] == (2, 4) and times[(0, "0B0")] == (13, 16) and times[(0, "0B1")] == (17, 20)
    with raises_code(InvalidConfigError, ErrorCode.BAD_VALUE):
        replay_order(_gpipe(2, 2), cost, link_ns={(1, 0): -1})


def test_weights_wait_for_their_inputs_gradient_and_a_hop_only_between_ranks() -> None:
    # two stages on one rank: no hop between them; W after its own I, even when listed right after it
    order = {
        0: [
            _act(0, "F", 0),
            _act(1, "F", 0),
            _act(1, "I", 0),
            _act(0, "I", 0),
            _act(1, "W", 0),
            _act(0, "W", 0),
        ]
    }
    step = replay_order(order, _costs(2), hop_ns=10_000)
    assert step.window_ns == 6 * 1000 and step.bubble_ratio == 0
    with raises_code(InvalidConfigError, ErrorCode.SCHEDULE_DEADLOCK):  # W before its I on the same rank
        replay_order({0: [_act(0, "F", 0), _act(0, "W", 0), _act(0, "I", 0)]}, _costs(1))


@pytest.mark.parametrize(
    ("order", "code"),
    [
        ({0: []}, ErrorCode.NO_COMPUTE),
        ({0: [_act(0, "F", 0)], 1: [_act(1, "B", 0)]}, ErrorCode.BAD_SCHEDULE),
        ({0: [_act(0, "F", 0)], 1: [_act(0, "B", 0)]}, ErrorCode.BAD_SCHEDULE),
        ({0: [_act(0, "F", 0), _act(0, "F", 0)]}, ErrorCode.BAD_SCHEDULE),
        ({0: [_act(0, "SEND_F", 0)]}, ErrorCode.BAD_SCHEDULE),
    ],
)
def test_orders_that_cannot_run_are_one_line_errors(order: dict[int, list[Action]], code: ErrorCode) -> None:
    with raises_code(InvalidConfigError, code):
        replay_order(order, _costs(2))


def _run_of(
    order: dict[int, list[Action]],
    cost: dict[tuple[int, str], int],
    steps: int = 3,
    host: dict[tuple[int, str], int] | None = None,
    device: str = "cpu",
) -> Trace:
    """A run of `order`, as its replay writes it (forward/backward spans labelled like the hook's), each
    action's host time before it a send and its wait for another rank a `recv_wait`, on ranks of `device`."""
    one = replay_order(order, cost, host_ns=host)
    stages = 1 + max(a.stage for acts in order.values() for a in acts)
    meta = RunMeta(
        source="pipelining",
        status="finished",
        world_size=len(order),
        pp_size=len(order),
        schedule="1f1b",
        microbatches=1 + max(a.mb for acts in order.values() for a in acts),
        chunks=stages // len(order),
        ranks=[RankInfo(rank=r, stage=r, device=device) for r in order],
    )
    period = one.end_ns + 500  # the optimizer between steps
    rows = []
    for k in range(steps):
        for t in one.actions:
            a = t.action
            label = {"rank": t.rank, "stage": a.stage, "mb": a.mb, "step": k, "phase": a.type, "name": str(a)}
            kind = "forward" if a.type == "F" else "backward"
            shown = [(kind, "compute", t.start_ns, t.end_ns)]
            before = (host or {}).get((a.stage, a.type), 0)
            shown += [("send", "send", t.wait_from_ns - before, t.wait_from_ns)] if before else []
            shown += [("recv_wait", "recv", t.wait_from_ns, t.start_ns)] if t.start_ns > t.wait_from_ns else []
            for what, lane, lo, hi in shown:
                rows.append(
                    {**label, "kind": what, "lane": lane, "start_ns": lo + k * period, "end_ns": hi + k * period}
                )
    return Trace.from_records(rows, meta=meta)


def test_a_runs_actions_costs_and_bubble_are_read_from_its_spans(tmp_path: Path) -> None:
    cost = {(0, "F"): 1000, (1, "F"): 1500, (0, "B"): 2000, (1, "B"): 2600}
    order = _one_f_one_b(2, 4)
    trace = _run_of(order, cost)
    acts = training_actions(trace)
    assert len(acts) == 3 * 16 and set(acts["phase"]) == {"F", "B"}
    assert acts[acts["stage"] == 1].groupby("phase")["busy_ns"].median().to_dict() == {"B": 2600, "F": 1500}
    replay, replayed = replay_training(trace)
    expected = replay_order(order, cost).bubble_ratio
    assert replay.bubble_ratio == pytest.approx(expected) and replay.steps == [0, 1, 2]
    assert replay.measured_step_ratio == pytest.approx(expected)  # the run is its own replay
    assert replay.costs_ns == {0: {"B": 2000.0, "F": 1000.0}, 1: {"B": 2600.0, "F": 1500.0}}
    assert (replay.hop_ns, replay.hop_measured) == (0, False) and "hop latency taken as 0" in replay.note
    # the replay is a run of its own: stored and analysed, it gives the same ratio
    assert replayed is not None and replayed.meta.source == "simulator"
    again = analyze(load_run(write_run(replayed, tmp_path / "replay")))
    assert again.bubble_ratio == pytest.approx(expected)
    # a step cut by the trace's end is left out and named
    s = trace.spans
    cut = dataclasses.replace(trace, spans=s[~((s["step"] == 2) & (s["phase"] == "B") & (s["mb"] == 3))])
    replay, _ = replay_training(cut)
    assert replay.steps == [0, 1] and "step(s) 2 left out" in replay.note


def test_a_cpu_ranks_host_time_before_each_action_is_read_and_replayed() -> None:
    # on a CPU the rank's thread is the device: what it does between its actions that is no wait (here a send
    # before each) is its own time, which the replay puts before the action, idle to the ratio
    cost = {(0, "F"): 1000, (1, "F"): 1500, (0, "B"): 2000, (1, "B"): 2600}
    host = {(0, "F"): 300, (1, "F"): 200, (0, "B"): 100, (1, "B"): 400}
    order = _one_f_one_b(2, 4)
    trace = _run_of(order, cost, host=host)
    acts = training_actions(trace)
    first = acts.groupby(["rank", "step"]).cumcount().to_numpy() == 0  # no action before it on its rank
    assert (acts.loc[first, "host_ns"] == 0).all()
    later = acts[~first]
    assert later["host_ns"].tolist() == [host[(s, t)] for s, t in zip(later["stage"], later["phase"], strict=True)]
    assert acts.groupby(["stage", "phase"])["busy_ns"].median().to_dict() == cost  # waits and sends are not busy
    expected = replay_order(order, cost, host_ns=host).bubble_ratio
    assert expected > replay_order(order, cost).bubble_ratio  # the host time is idle to the ratio
    replay, _ = replay_training(trace)
    assert replay.bubble_ratio == pytest.approx(expected) and replay.measured_step_ratio == pytest.approx(expected)
    assert replay.host_ns == {s: {t: float(host[(s, t)]) for t in "FB"} for s in range(2)}
    # on a GPU rank the same spans give none: its device's queue runs ahead of the host
    assert (training_actions(_run_of(order, cost, host=host, device="cuda:0"))["host_ns"] == 0).all()
    with raises_code(InvalidConfigError, ErrorCode.BAD_VALUE):
        replay_order(order, cost, host_ns={(0, "F"): -1})


def test_a_long_run_replays_evenly_spaced_steps() -> None:
    trace = _run_of(_gpipe(2, 2), _costs(2), steps=MAX_STEPS + 6)
    replay, replayed = replay_training(trace)
    assert len(replay.steps) == MAX_STEPS and replay.steps[0] == 0 and replay.steps[-1] == MAX_STEPS + 5
    assert f"{MAX_STEPS} of the {MAX_STEPS + 6} complete steps" in replay.note
    assert replayed is not None and sorted(replayed.spans["step"].unique()) == replay.steps
    assert replay.bubble_ratio == pytest.approx(gpipe_bubble(2, 2))


def test_bad_traces_give_a_note_not_a_traceback() -> None:
    nothing, none = replay_training(Trace.from_records([{"kind": "forward", "start_ns": 0, "end_ns": 5}]))
    assert nothing.bubble_ratio is None and "no training actions" in nothing.note and none is None
    trace = _run_of(_gpipe(2, 2), _costs(2), steps=1)
    s = trace.spans
    cut = dataclasses.replace(trace, spans=s[~((s["stage"] == 0) & (s["phase"] == "B"))])
    replay, none = replay_training(cut)
    assert replay.bubble_ratio is None and "no complete step" in replay.note and none is None
    res = analyze(cut)
    res.replay = replay
    assert "replay: -" in render_text(res) and "no complete step" in render_text(res)


def test_analyze_prints_the_replay_beside_the_measured_bubble(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_run(_run_of(_one_f_one_b(3, 6), _costs(3)), tmp_path / "run")
    assert main(["analyze", str(run)]) == 0
    text = capsys.readouterr().out
    line = next(ln for ln in text.splitlines() if ln.startswith("replay:"))
    assert f"replay: {100 * gpipe_bubble(3, 6):.1f}%" in line and "own action order" in line
    assert main(["analyze", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["replay"]
    assert out["bubble_ratio"] == pytest.approx(gpipe_bubble(3, 6)) and out["steps"] == [0, 1, 2]
    assert out["costs_ns"]["2"] == {"B": 2000.0, "F": 1000.0} and out["hop_measured"] is False
