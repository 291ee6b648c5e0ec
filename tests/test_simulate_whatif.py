"""What-ifs of a training job (`ppscope.simulate.whatif`): its step replayed in its own order with balanced
costs and without its straggler, per (stage, replica), on jobs whose costs are known; the speedups against the
replay called directly on costs built here; `ppscope analyze` printing them; a reason where there is nothing to
replay."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from replica_helpers import replica_job
from training_jobs import one_f_one_b, training_job

from ppscope.analysis.placement import parse_stage_of_rank, placement_of
from ppscope.cli.main import main
from ppscope.formats.sources import open_trace
from ppscope.simulate.simulator import write_run
from ppscope.simulate.training import replay_order
from ppscope.simulate.whatif import balanced_costs, read_job, replay_job, straggler_costs, what_if
from ppscope.trace.model import Trace
from ppscope.trace.notices import NoticeCode

F_NS, B_NS = 1000, 2000


def _step_ns(p: int, m: int, cost: dict[tuple[int, str], float]) -> int:
    """One 1F1B pipeline's step replayed directly on `cost`."""
    return replay_order(one_f_one_b(p, m), {k: round(v) for k, v in cost.items()}).window_ns


def _costs(p: int, slow: dict[int, float]) -> dict[tuple[int, str], float]:
    return {(s, t): c * slow.get(s, 1.0) for s in range(p) for t, c in (("F", F_NS), ("B", B_NS))}


def test_a_slow_last_stage_is_what_balancing_buys() -> None:
    # 2 replicas × 4 stages, the last stage 1.6× slower in both: balancing buys, replacing a node does not
    trace = training_job(4, 2, m=8, slow={(3, 0): 1.6, (3, 1): 1.6})
    w, why = what_if(trace)
    assert why is None and w is not None and w.replicas == 2 and w.steps == [0, 1, 2]
    measured = _costs(4, {3: 1.6})
    mean_f, mean_b = F_NS * 4.6 / 4, B_NS * 4.6 / 4  # the work conserved, spread evenly
    even = {(s, t): c for s in range(4) for t, c in (("F", mean_f), ("B", mean_b))}
    expected = _step_ns(4, 8, measured) / _step_ns(4, 8, even)
    assert w.balanced is not None and w.balanced.speedup == pytest.approx(expected, rel=0.02)
    assert w.balanced.speedup > 1.2
    assert w.replay_step_ns == pytest.approx(_step_ns(4, 8, measured))
    assert w.measured_step_ns == pytest.approx(w.replay_step_ns)  # the run is its own replay
    assert w.no_straggler is not None and w.no_straggler.speedup == pytest.approx(1.0)
    assert w.straggler is not None and w.straggler.stage == 3 and w.straggler.vs_median == pytest.approx(1.0)


def test_a_single_slow_rank_is_the_straggler_and_replacing_it_buys_most() -> None:
    trace = training_job(4, 2, m=8, slow={(1, 1): 2.0})  # rank 1 * 2 + 1 = 3
    w, _ = what_if(trace)
    assert w is not None and w.straggler is not None
    assert (w.straggler.stage, w.straggler.replica, w.straggler.ranks) == (1, 1, [3])
    assert w.straggler.vs_median == pytest.approx(2.0)
    assert w.no_straggler is not None and w.balanced is not None
    assert w.no_straggler.speedup > w.balanced.speedup > 1
    # the slow replica sets the job's step; without its straggler it runs as the other one does
    assert w.replay_step_ns == pytest.approx(_step_ns(4, 8, _costs(4, {1: 2.0})))
    assert w.no_straggler.step_ns == pytest.approx(_step_ns(4, 8, _costs(4, {})))


def test_the_replay_of_given_costs_is_public_and_conserves_work() -> None:
    trace = training_job(3, 3, m=4, slow={(2, 0): 1.5, (0, 2): 1.2})
    job, why = read_job(trace)
    assert why is None and job is not None and set(job.costs) == {0, 1, 2}
    assert job.units[(2, 0)] == [6] and job.runs[(2, 0)] == [2]
    even = balanced_costs(job.costs)
    for rep, c in job.costs.items():  # the work of each replica and type is conserved
        for t in ("F", "B"):
            assert sum(v for (_, tt), v in even[rep].items() if tt == t) == pytest.approx(
                sum(v for (_, tt), v in c.items() if tt == t)
            )
        assert len({v for (_, tt), v in even[rep].items() if tt == "F"}) == 1
    assert replay_job(job, job.costs) == pytest.approx(_step_ns(3, 4, _costs(3, {2: 1.5})))  # replica 0 is slowest
    fixed = straggler_costs(job, 2, 0)
    assert fixed[0][(2, "F")] == pytest.approx(F_NS) and fixed[1] == job.costs[1]
    # the job's step is its slowest replica's: replica 2's stage 0 (1.2×) is then the slowest
    assert replay_job(job, fixed) == pytest.approx(_step_ns(3, 4, _costs(3, {0: 1.2})))


def test_tensor_parallel_ranks_count_as_one_stage() -> None:
    one = what_if(training_job(4, 2, m=4, slow={(1, 1): 2.0}))[0]
    tp = what_if(training_job(4, 2, m=4, slow={(1, 1): 2.0}, tp=2))[0]
    assert one is not None and tp is not None and tp.straggler is not None
    assert (tp.straggler.stage, tp.straggler.replica, tp.straggler.ranks) == (1, 1, [6, 7])
    assert tp.balanced is not None and one.balanced is not None and tp.no_straggler is not None
    assert (tp.replay_step_ns, tp.balanced.speedup) == (one.replay_step_ns, one.balanced.speedup)
    # a TP rank's action costs what the slowest of its stage's ranks took: they wait for each other
    trace = training_job(2, 2, m=4, tp=2)
    s = trace.spans.copy()
    mine = (s["rank"] == 1).to_numpy()  # stage 0, replica 0's second TP rank: its forwards 3× longer
    fwd = mine & (s["phase"] == "F").to_numpy()
    s.loc[fwd, "end_ns"] = s.loc[fwd, "start_ns"] + 3 * F_NS
    job, _ = read_job(dataclasses.replace(trace, spans=s))
    assert job is not None and job.costs[0][(0, "F")] == 3 * F_NS and job.costs[1][(0, "F")] == F_NS


def test_one_replica_has_no_straggler_to_replace() -> None:
    w, why = what_if(training_job(4, 1, m=8, slow={(3, 0): 1.6}))
    assert why is None and w is not None and w.no_straggler is None and w.straggler is None
    assert w.reasons["no_straggler"].code == NoticeCode.ONE_REPLICA
    assert w.balanced is not None and w.balanced.speedup > 1.2
    # a trace without replica metadata: one pipeline, each rank its own stage
    trace = training_job(4, 1, m=8)
    bare = dataclasses.replace(trace, meta=dataclasses.replace(trace.meta, ranks=[]))
    w, _ = what_if(bare)
    assert w is not None and w.balanced is not None and w.balanced.speedup == pytest.approx(1.0)


def test_a_placement_given_by_the_user_is_used() -> None:
    trace = training_job(2, 2, m=4, slow={(0, 1): 2.0})  # ranks stage-major: 0, 1 stage 0; 2, 3 stage 1
    bare = dataclasses.replace(trace, meta=dataclasses.replace(trace.meta, ranks=[]))
    placement = placement_of(bare, parse_stage_of_rank("rank//2"))
    w, _ = what_if(bare, placement)
    assert w is not None and w.straggler is not None and (w.straggler.stage, w.straggler.ranks) == (0, [1])


def test_no_training_step_is_a_reason_not_a_figure() -> None:
    w, why = what_if(replica_job(2, 2))  # inference
    assert w is None and why is not None and why.code == NoticeCode.NO_TRAINING_STEP
    trace = training_job(2, 2, m=4, steps=1)
    s = trace.spans
    cut = s[~((s["rank"] >= 2) & (s["phase"] == "B") & (s["mb"] == 3)).to_numpy()]  # the step cut by the end
    w, why = what_if(dataclasses.replace(trace, spans=cut))
    assert w is None and why is not None and why.code == NoticeCode.NO_COMPLETE_STEP
    w, why = what_if(Trace.from_records([{"kind": "forward", "start_ns": 0, "end_ns": 5}]))
    assert w is None and why is not None and why.code == NoticeCode.NO_TRAINING_STEP


def test_a_step_cut_in_one_replica_is_left_out() -> None:
    trace = training_job(2, 2, m=4, steps=3)
    s = trace.spans
    gone = ((s["rank"] == 1) & (s["step"] == 2) & (s["phase"] == "B")).to_numpy()
    w, _ = what_if(dataclasses.replace(trace, spans=s[~gone]))
    assert w is not None and w.steps == [0, 1]


def test_a_replica_missing_a_rank_is_left_out_and_named() -> None:
    trace = training_job(2, 3, m=4, slow={(0, 1): 2.0})  # ranks stage-major: rank 5 is stage 1, replica 2
    s = trace.spans
    w, _ = what_if(dataclasses.replace(trace, spans=s[(s["rank"] != 5).to_numpy()]))  # its file lost
    assert w is not None and w.left_out == [2] and w.replicas == 2 and w.steps == [0, 1, 2]
    assert w.straggler is not None and (w.straggler.stage, w.straggler.replica) == (0, 1)
    assert w.to_json()["left_out_replicas"] == [2]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved-1f1b", "zbv", "dualpipev"])
def test_real_captures_of_torchs_schedules_give_what_ifs(schedule: str) -> None:
    trace = open_trace(Path(__file__).parent / "data" / "pipelining" / schedule)
    w, why = what_if(trace)
    assert why is None and w is not None and w.replicas == 1 and w.steps == [0, 1]
    assert w.balanced is not None and w.balanced.step_ns > 0 and set(w.reasons) == {"no_straggler"}
    job, _ = read_job(trace)
    assert job is not None and sorted(job.units) == [(0, 0), (1, 0)]  # 2 ranks, whatever the stages per rank
    chunks = 1 if schedule in ("gpipe", "1f1b") else 2
    assert all(len(stages) == chunks for stages in job.runs.values())


def test_analyze_prints_and_reports_the_what_ifs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(training_job(4, 2, m=8, slow={(2, 1): 2.0}), tmp_path / "job")
    assert main(["analyze", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    w = out["what_if"]
    assert out["what_if_reason"] is None and set(w["balanced"]) == {"step_ms", "speedup"}
    assert w["straggler"]["stage"] == 2 and w["straggler"]["replica"] == 1 and w["straggler"]["ranks"] == [5]
    assert w["no_straggler"]["speedup"] > w["balanced"]["speedup"] > 1
    assert w["no_straggler"]["step_ms"] == pytest.approx(_step_ns(4, 8, _costs(4, {})) / 1e6)
    assert main(["analyze", str(run)]) == 0
    text = capsys.readouterr().out
    assert "what-if: the job's step (2 replicas, the slowest sets it)" in text
    assert "without the straggler (stage 2, replica 1, rank(s) 5, ×2.00 its stage's median)" in text
    # one pipeline: no straggler, and why
    one = write_run(training_job(3, 1, m=4), tmp_path / "one")
    assert main(["analyze", str(one), "--json"]) == 0
    w = json.loads(capsys.readouterr().out)["what_if"]
    assert w["no_straggler"] is None and w["reasons"]["no_straggler"]["code"] == "one_replica"
    assert w["balanced"]["speedup"] == pytest.approx(1.0)


def test_analyze_json_of_a_slow_last_stage_matches_the_replay_of_balanced_costs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_run(training_job(4, 2, m=8, slow={(3, 0): 1.6, (3, 1): 1.6}), tmp_path / "job")
    assert main(["analyze", str(run), "--json"]) == 0
    w = json.loads(capsys.readouterr().out)["what_if"]
    even = {(s, t): c * 4.6 / 4 for s in range(4) for t, c in (("F", F_NS), ("B", B_NS))}
    expected = _step_ns(4, 8, _costs(4, {3: 1.6})) / _step_ns(4, 8, even)
    assert w["balanced"]["speedup"] == pytest.approx(expected, rel=0.02)
    assert w["straggler"]["stage"] == 3 and w["no_straggler"]["speedup"] == pytest.approx(1.0)


def test_analyze_of_an_inference_run_says_why_there_is_no_what_if(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_run(replica_job(2, 1), tmp_path / "inference")
    assert main(["analyze", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["what_if"] is None and out["what_if_reason"]["code"] == "no_training_step"
    assert main(["analyze", str(run)]) == 0
    assert "what-if" not in capsys.readouterr().out  # not a training run: nothing to say


def test_many_steps_replay_each_distinct_order_once() -> None:
    trace = training_job(2, 2, m=2, steps=80)
    job, _ = read_job(trace)
    assert job is not None and len(job.steps) == 64 and job.steps[-1] == 79
    assert replay_job(job, job.costs) == pytest.approx(np.median([_step_ns(2, 2, _costs(2, {}))]))
