"""Real torch.distributed.pipelining jobs under torchrun (2 ranks, gloo, CPU), profiled and recorded at once:
the Kineto traces and the hook's run of the same job name the same schedule, stages, ranks and
micro-batches, the profiler's bubble lies between the one its action ranges give (waits inside counted
busy) and the one its compute operators alone give, both read every cause within 2 points of the window
(one job, one reading), and `analyze` prints the replay of the run's own action order next to the measured
bubble of the same steps."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from error_helpers import cli_error

from ppscope.analysis import AnalysisResult, analyze
from ppscope.analysis.result import CAUSES
from ppscope.cli.main import main
from ppscope.errors import ErrorCode
from ppscope.formats.sources import open_trace
from ppscope.simulate.training import replay_training
from ppscope.trace.model import Trace
from ppscope.trace.notices import NoticeCode

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--microbatches", "4", "--steps", "2", "--layers", "4", "--dim", "32", "--seq", "16"]
JOB = ["--microbatches", "4", "--steps", "2", "--layers", "4", "--dim", "256", "--seq", "64"]
"""SMALL's job with actions of about 5 ms each: each capture's own bookkeeping (the hook's inside the
profiler's action ranges, the profiler's inside the hook's spans) is idle time to the other, a few tens of µs
an action, a point of the window or less here and several on SMALL's 0.5 ms actions."""
SCHEDULES = ["gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zero-bubble", "zbv", "dualpipev"]


def _train(schedule: str, out: Path, shape: list[str] = SMALL) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(ROOT / "examples" / "pipelining_train.py"),
        "--schedule",
        schedule,
        *shape,
        "--profile",
        str(out / "prof"),
        "--ppscope",
        str(out / "run"),
    ]
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]


def _shape(trace: Trace) -> tuple[list[int], list[int], list[int]]:
    """Ranks, stages and micro-batches of the compute actions."""
    s = trace.spans
    acts = s[s["phase"].isin(["F", "B", "I", "W"]) & (s["mb"] >= 0)]
    return trace.ranks, sorted(int(x) for x in acts["stage"].unique()), sorted(int(x) for x in acts["mb"].unique())


def _share(result: AnalysisResult, cause: str) -> float:
    """The cause's share of the stages' time over the window (P × window)."""
    assert result.window is not None
    return sum(s.causes[cause] for s in result.stages) / (len(result.stages) * result.window.length_ns)


def _ops_alone(trace: Trace) -> Trace:
    """The trace with its waits and sends as plain ranges: only the operators tell busy from idle."""
    s = trace.spans
    return dataclasses.replace(trace, spans=s.assign(kind=s["kind"].replace({"recv_wait": "range", "send": "range"})))


def _ranges_busy(trace: Trace) -> Trace:
    """The trace with each compute action's whole range made busy too (its waits inside counted busy)."""
    s = trace.spans
    ranges = s[(s["kind"] == "range") & s["phase"].isin(["F", "B", "I", "W"])].assign(kind="kernel", lane="compute")
    return dataclasses.replace(trace, spans=pd.concat([s, ranges], ignore_index=True))


def _per_mb(result: AnalysisResult) -> list[float]:
    """Each stage's time per micro-batch pass, all known."""
    times = [s.time_per_mb_ns for s in result.stages]
    assert None not in times, times
    return [float(t) for t in times if t is not None]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_profiler_and_hook_see_the_same_pipeline(
    schedule: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _train(schedule, tmp_path, JOB)
    prof, run = open_trace(tmp_path / "prof"), open_trace(tmp_path / "run")
    assert prof.meta.schedule == run.meta.schedule == schedule
    assert (prof.meta.microbatches, prof.meta.chunks) == (run.meta.microbatches, run.meta.chunks)
    assert _shape(prof) == _shape(run) == ([0, 1], list(range(2 * run.meta.chunks)), [0, 1, 2, 3])
    assert run.meta.status == "finished" and run.meta.source == "pipelining"
    measured, hooked = analyze(prof), analyze(run)
    assert len(measured.stages) == len(hooked.stages) == 2
    lower, upper = analyze(_ranges_busy(prof)).bubble_ratio, analyze(_ops_alone(prof)).bubble_ratio
    assert measured.bubble_ratio is not None and lower is not None and upper is not None
    # on a CPU the rank's thread is the device: its compute actions are busy but for the waits and sends inside
    # them, so the profiler's bubble lies between the actions' whole ranges and the operators alone
    assert lower <= measured.bubble_ratio < upper  # equal where no wait lies inside an action (inferred ones)
    assert sum(st.causes["unknown"] for st in measured.stages) == 0
    # one job, one reading: the hook and the profiler give each cause within 2 points of the window. The hook
    # does not see the optimizer (the profiler's `Optimizer.step#` range), about a point here.
    for cause in CAUSES:
        assert _share(measured, cause) == pytest.approx(_share(hooked, cause), abs=0.02), cause
    assert not {w.code for w in measured.warnings} & {NoticeCode.CLOCK_SKEW}  # one host, one clock
    # and the same time per micro-batch pass of each stage: the profile's forward actions count the passes
    assert measured.imbalance_basis == hooked.imbalance_basis == "time_per_mb"
    kineto, hook = _per_mb(measured), _per_mb(hooked)
    # Where the schedule writes action ranges, they hold the hook's span and the profiler's own cost per
    # operator: the profile reads 0 to 2.5% more. Where they are inferred (Schedule1F1B) they run from the first
    # operator to the last, without the Python at each end of the hook's span: 2.4 to 5.9% less seen.
    inferred = bool(prof.spans["name"].str.endswith("(inferred)").any())
    low, high = (0.90, 1.02) if inferred else (0.97, 1.07)
    for k, h in zip(kineto, hook, strict=True):
        assert low <= k / h <= high, (k, h, inferred)
    # the stages' ratio, which the advice rests on, is the same either way
    assert kineto[0] / kineto[1] == pytest.approx(hook[0] / hook[1], rel=0.04)
    if schedule == "gpipe":
        assert measured.theory.formula == hooked.theory.formula == "GPipe (P-1)/(M+P-1)"
        assert measured.theory.bubble_ratio == pytest.approx(1 / 5)
    # the replay of the run's own order leaves out host time between actions and the machine's noise: at most
    # the measured ratio of the same steps (a little slack), and below it by what a shared 2-core machine adds
    # to these tiny models (0.1 to 0.45 seen)
    assert main(["analyze", str(tmp_path / "run"), "--json"]) == 0
    replay = json.loads(capsys.readouterr().out)["replay"]
    assert replay["bubble_ratio"] is not None and replay["measured_step_bubble_ratio"] is not None, replay["note"]
    assert replay["steps"] == [0, 1] and replay["hop_measured"]
    assert 0 < replay["bubble_ratio"] <= replay["measured_step_bubble_ratio"] + 0.05
    # how far below depends on the machine's load (0.1 to 0.61 seen on a shared 2-core machine): not asserted
    from_profile, _ = replay_training(prof)  # the Kineto import's actions replay too
    assert from_profile.bubble_ratio is not None and from_profile.steps, from_profile.note


def test_an_unbalanced_training_run_is_advised_in_the_trainers_terms(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ppscope.cli.main import main

    # actions of a few ms (dim 256): on the tiny model host time between actions is a sixth of the step, which
    # the step's replay leaves out, and the interval it widens reaches ×1 (keep, rightly: 4,4 then measures
    # ×0.9 to ×1.25 against 6,2 on a 2-core machine); here the advice is to change on a quiet machine
    shape = ["--microbatches", "4", "--steps", "4", "--layers", "8", "--split", "6,2", "--dim", "256", "--seq", "64"]
    _train("1f1b", tmp_path, shape)
    run = tmp_path / "run"
    assert open_trace(run).meta.split == [6, 2]
    assert main(["rebalance", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["current_split"] == [6, 2] and out["proposed_split"][0] < 6  # layers off the slow stage
    assert out["predicted_speedup"] > 1 and out["training"]["passes"] == "forward+backward"
    # the costs are each stage's forward + backward per micro-batch, as the hook's spans show them
    spans = open_trace(run).spans
    for s, measured in enumerate(out["measured_stage_ms"]):
        mine = spans[(spans["stage"] == s) & spans["kind"].isin(["forward", "backward", "head"])]
        backward = mine[mine["kind"] == "backward"]
        assert measured == pytest.approx((mine["end_ns"] - mine["start_ns"]).sum() / 16 / 1e6)
        assert (backward["end_ns"] - backward["start_ns"]).sum() > 0.2 * measured * 16 * 1e6
    # the trainer's lines, never vLLM's; printed where the advice is to change. Under load (a test suite beside
    # it) the replay misses more of the step and its wider interval may reach ×1: then it says keep
    assert out["megatron_layout"].startswith("--pipeline-model-parallel-layout 'Et*") and out["vllm_env"] is None
    assert str(out["torchtitan_toml"]).startswith("module_fqns_per_model_part")
    assert main(["rebalance", str(run)]) == 0
    text = capsys.readouterr().out
    if out["advice"] == "change":
        assert "--pipeline-model-parallel-layout 'Et*" in text and "module_fqns_per_model_part" in text
    else:
        assert "reaches ×1" in out["advice_reason"] and "the proposed split, not advised: " in text
    prof = tmp_path / "prof"
    failed = cli_error(capsys, ["rebalance", str(prof)])  # the profiler's traces record no split
    assert failed.exit_code == 2 and failed.code == ErrorCode.NO_LAYER_SPLIT and "--current-split" in failed.text
    assert main(["rebalance", str(prof), "--current-split", "6,2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["proposed_split"][0] < 6 and "Kineto" in out["training"]["from"]


def test_data_parallel_pipelines_are_placed_alike_by_the_hook_and_the_profiler(tmp_path: Path) -> None:
    """Two replicas of a 2-stage 1F1B pipeline (4 ranks, `--dp 2`): the hook records each rank's replica from
    its pipeline's process group, the Kineto importer from `distributedInfo`, and both place every rank alike."""
    from ppscope.analysis.placement import placement_of

    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "4",
        str(ROOT / "examples" / "pipelining_train.py"),
        "--schedule",
        "1f1b",
        "--dp",
        "2",
        *SMALL,
        "--profile",
        str(tmp_path / "prof"),
        "--ppscope",
        str(tmp_path / "run"),
    ]
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    hook, kineto = open_trace(tmp_path / "run"), open_trace(tmp_path / "prof")
    want = {0: (0, 0), 1: (1, 0), 2: (0, 1), 3: (1, 1)}  # rank: (stage, replica)
    for trace in (hook, kineto):
        placement = placement_of(trace)
        assert placement is not None and placement.place == want, (trace.meta.source, placement)
        talks = trace.spans[trace.spans["peer"] >= 0].groupby("rank")["peer"].unique()
        assert {r: sorted(int(p) for p in peers) for r, peers in talks.items()} == {0: [1], 1: [0], 2: [3], 3: [2]}
    assert [i.replica for i in sorted(hook.meta.ranks, key=lambda i: i.rank)] == [0, 0, 1, 1]
