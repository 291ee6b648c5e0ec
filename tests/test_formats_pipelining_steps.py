"""Training steps and waits in real Kineto captures without `ProfilerStep#N` ranges: torch.distributed.pipelining's
seven schedules (`tests/data/pipelining-nosteps/`) and DeepSpeed's pipeline engine
(`tests/data/deepspeed-pipeline/`), each of 2 ranks; the steps told apart by the optimizer's step, a
collective, or the first stage's pauses; the engine named."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from ppscope.analysis import theory_for
from ppscope.cli.main import main
from ppscope.formats.pipelining.steps import StepsFrom
from ppscope.formats.sources import open_trace
from ppscope.trace.notices import NoticeCode
from ppscope.trace.schedules import Engine

DATA = Path(__file__).resolve().parent / "data"
NOSTEPS = DATA / "pipelining-nosteps"
DEEPSPEED = DATA / "deepspeed-pipeline"
SCHEDULES = {  # folder: (the schedule's name in ppscope, stages per rank V)
    "gpipe": ("gpipe", 1),
    "1f1b": ("1f1b", 1),
    "interleaved-1f1b": ("interleaved-1f1b", 2),
    "looped-bfs": ("looped-bfs", 2),
    "zero-bubble": ("zero-bubble", 2),
    "zbv": ("zbv", 2),
    "dualpipev": ("dualpipev", 2),
}


def _analyze(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["analyze", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _codes(result: dict[str, Any]) -> set[str]:
    return {w["code"] for w in result["warnings"]}


def _without(src: Path, dst: Path, prefixes: tuple[str, ...]) -> Path:
    """A copy of the capture in `src` without the events whose names start with `prefixes`."""
    dst.mkdir()
    for f in sorted(src.glob("rank-*.json.gz")):
        doc = json.loads(gzip.decompress(f.read_bytes()))
        doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith(prefixes)]
        (dst / f.name).write_bytes(gzip.compress(json.dumps(doc).encode()))
    return dst


@pytest.mark.parametrize("folder", sorted(SCHEDULES))
def test_each_schedule_reads_two_steps_of_eight_microbatches(folder: str, capsys: pytest.CaptureFixture[str]) -> None:
    schedule, v = SCHEDULES[folder]
    res = _analyze(NOSTEPS / folder, capsys)
    assert res["schedule"] == schedule
    assert res["engine"] == str(Engine.TORCH)
    assert open_trace(NOSTEPS / folder).meta.microbatches == 8
    expected = theory_for(schedule, p=2, m=8, v=v).bubble_ratio  # None for interleaved ZB: no formula
    assert res["theory"]["bubble_ratio"] == (pytest.approx(expected) if expected is not None else None)
    assert res["replay"]["steps"] == [0, 1]
    assert res["replay"]["bubble_ratio"] is not None
    assert not any(c in _codes(res) for c in ("assumed_waits", "unknown_actions"))


def test_schedule1f1b_without_profiler_steps_has_the_textbook_bubble(capsys: pytest.CaptureFixture[str]) -> None:
    res = _analyze(NOSTEPS / "1f1b", capsys)
    assert res["theory"]["bubble_ratio"] == pytest.approx(1 / 9)  # (P-1)/(M+P-1), P=2, M=8
    assert NoticeCode.UNMARKED_STEPS in _codes(res)
    trace = open_trace(NOSTEPS / "1f1b")
    assert trace.meta.config["pipelining"]["steps_from"] == StepsFrom.OPTIMIZER
    compute = trace.spans[trace.spans["kind"].eq("kernel") & (trace.spans["mb"] >= 0)]
    for (_, step), mbs in compute.groupby(["rank", "step"])["mb"]:
        assert sorted(mbs.unique()) == list(range(8)), step  # ids restart each step


def test_profiler_steps_still_mark_the_steps(capsys: pytest.CaptureFixture[str]) -> None:
    res = _analyze(DATA / "pipelining" / "1f1b", capsys)
    assert res["engine"] == str(Engine.TORCH)
    assert res["replay"]["steps"] == [0, 1]
    assert open_trace(DATA / "pipelining" / "1f1b").meta.config["pipelining"]["steps_from"] == StepsFrom.PROFILER_STEP
    assert NoticeCode.UNMARKED_STEPS not in _codes(res)


def test_without_any_mark_the_first_stages_pauses_cut_the_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = _without(NOSTEPS / "1f1b", tmp_path / "bare", ("Optimizer.",))
    assert open_trace(bare).meta.config["pipelining"]["steps_from"] == StepsFrom.PAUSE
    res = _analyze(bare, capsys)
    assert res["theory"]["params"]["M"] == 8
    assert res["replay"]["steps"] == [0, 1]


def test_deepspeed_reads_three_steps_of_eight(capsys: pytest.CaptureFixture[str]) -> None:
    res = _analyze(DEEPSPEED, capsys)
    assert res["engine"] == str(Engine.DEEPSPEED)
    assert res["schedule"] == "1f1b"
    assert res["theory"]["params"] == {"P": 2, "M": 8}
    assert res["theory"]["bubble_ratio"] == pytest.approx(1 / 9)
    assert res["replay"]["steps"] == [0, 1, 2]
    links = res["replay"]["link_latency_ns"]  # each direction its own: the gradients' is the slower here
    assert set(links) == {"0->1", "1->0"} and links["1->0"] > links["0->1"] > 0
    assert not any("Schedule1F1B" in w["text"] for w in res["warnings"])
    assert {"inferred_actions", "unmarked_steps"} <= _codes(res)
    assert "assumed_waits" not in _codes(res)


def test_deepspeed_steps_from_collectives_without_the_optimizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = _without(DEEPSPEED, tmp_path / "bare", ("Optimizer.",))
    assert open_trace(bare).meta.config["pipelining"]["steps_from"] == StepsFrom.COLLECTIVE
    res = _analyze(bare, capsys)
    assert res["theory"]["params"]["M"] == 8
    assert res["replay"]["steps"] == [0, 1, 2]


def test_deepspeed_last_stage_blocked_in_receives_waits(capsys: pytest.CaptureFixture[str]) -> None:
    """The last stage's time blocked in `gloo:recv` is a wait for its predecessor (`upstream`), not `host`;
    its time blocked in `gloo:send` is a send (`downstream`)."""
    trace = open_trace(DEEPSPEED)
    spans = trace.spans[trace.spans["rank"] == 1]
    recvs = spans[spans["kind"].eq("range") & spans["name"].eq("gloo:recv")]
    waits = spans[spans["kind"].eq("recv_wait")]
    assert len(waits) == 24  # one per forward of 3 steps x 8 micro-batches
    blocked = sum(
        any((w.start_ns <= r.start_ns) & (r.end_ns <= w.end_ns) for w in waits.itertuples()) for r in recvs.itertuples()
    )
    assert blocked == len(recvs) == 24
    sends = spans[spans["kind"].eq("send")]
    gloo_sends = spans[spans["kind"].eq("range") & spans["name"].eq("gloo:send")]
    assert (sends["end_ns"] - sends["start_ns"]).sum() >= (gloo_sends["end_ns"] - gloo_sends["start_ns"]).sum()
    res = _analyze(DEEPSPEED, capsys)
    last = next(s for s in res["stages"] if s["stage"] == 1)["causes"]
    assert last["upstream"] >= (recvs["end_ns"] - recvs["start_ns"]).sum() * 0.9
    assert last["upstream"] > last["host"]


def _gpu_rank(rank: int, events: list[tuple[str, str, float, float, int]]) -> dict[str, Any]:
    """A GPU rank's file from (category, name, ts, dur, correlation) rows: an operator with a correlation
    launches the kernel of that correlation one µs after it starts; a `flow` row starts an autograd flow."""
    out: list[dict[str, Any]] = []
    for cat, name, ts, dur, corr in events:
        row = {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": 7, "ts": ts, "dur": dur, "args": {}}
        if cat == "flow":
            out.append({"ph": "s", "cat": "fwdbwd", "name": "fwdbwd", "id": corr, "pid": 7, "tid": 7, "ts": ts})
        elif cat == "kernel":
            out.append(row | {"pid": 0, "tid": 7, "args": {"correlation": corr, "stream": 7}})
        else:
            out.append(row)
            if corr:
                out.append(
                    row
                    | {
                        "cat": "cuda_runtime",
                        "name": "cudaLaunchKernel",
                        "ts": ts + 1,
                        "dur": 1,
                        "args": {"correlation": corr},
                    }
                )
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
        "baseTimeNanoseconds": 1_790_000_000_000_000_000,
        "traceEvents": out,
    }


def test_nccl_kernels_of_a_receive_are_waits_without_action_ranges(tmp_path: Path) -> None:
    """A GPU 1F1B without action ranges: the NCCL kernel a `c10d::recv_` launched is the next action's
    wait for its input (`recv_wait` with the peer), not a transfer (`nccl`, cause comm)."""
    stage0 = [
        ("cpu_op", "aten::linear", 0, 30, 1),
        ("flow", "", 10, 0, 1),
        ("kernel", "gemm", 10, 30, 1),
        ("cpu_op", "c10d::send", 40, 5, 2),
        ("kernel", "ncclDevKernel_SendRecv", 45, 15, 2),
        ("cpu_op", "c10d::recv_", 50, 5, 3),
        ("kernel", "ncclDevKernel_SendRecv", 60, 140, 3),
        ("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", 210, 30, 4),
        ("kernel", "gemm_bwd", 211, 40, 4),
    ]
    stage1 = [
        ("cpu_op", "c10d::recv_", 0, 5, 1),
        ("kernel", "ncclDevKernel_SendRecv", 5, 75, 1),
        ("cpu_op", "aten::linear", 90, 30, 2),
        ("flow", "", 95, 0, 2),
        ("kernel", "gemm", 100, 30, 2),
        ("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", 130, 30, 3),
        ("kernel", "gemm_bwd", 140, 30, 3),
        ("cpu_op", "c10d::send", 170, 5, 4),
        ("kernel", "ncclDevKernel_SendRecv", 175, 15, 4),
    ]
    folder = tmp_path / "gpu"
    folder.mkdir()
    for rank, rows in enumerate((stage0, stage1)):
        (folder / f"rank-{rank}.json").write_text(json.dumps(_gpu_rank(rank, rows)))
    spans = open_trace(folder).spans
    waits = spans[spans["kind"] == "recv_wait"].sort_values("rank")
    assert list(zip(waits["rank"], waits["peer"], waits["phase"], waits["mb"], strict=True)) == [
        (0, 1, "B", 0),
        (1, 0, "F", 0),
    ]
    assert list(waits["end_ns"] - waits["start_ns"]) == [140_000, 75_000]


CAPTURES = sorted((DATA / "pipelining").glob("*/")) + sorted(NOSTEPS.glob("*/")) + [DEEPSPEED]


@pytest.mark.parametrize("folder", CAPTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_micro_batch_sends_once_per_step_and_direction(folder: Path) -> None:
    """A send is its own micro-batch's: ScheduleGPipe posts it inside its `Forward i` range, taken once for the
    previous action's (every label one low, the first send of a step lost, receives 'before' their sends)."""
    trace = open_trace(folder)
    sends = trace.spans[trace.spans["kind"] == "send"]
    per_step = sends.groupby(["stage", "phase", "step"])["mb"].apply(lambda mb: sorted(mb.tolist()))
    assert len(per_step) and all(mbs == list(range(trace.meta.microbatches)) for mbs in per_step), per_step


def test_a_replay_that_misses_the_run_widens_the_interval_to_keep(capsys: pytest.CaptureFixture[str]) -> None:
    """DeepSpeed on CPUs spends most of its step outside its actions: a gradient's blocking send and its
    receive both wait up to 12 ms on one 512 KiB message, which the training replay keeps only as the link's
    median latency. Replayed, its step is far off the measured one, and that error widens the interval until
    the advice is to keep the split, whatever the slowest stage alone promises."""
    assert main(["rebalance", str(DEEPSPEED), "--current-split", "4,4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["slowest_stage_speedup"] > 1.1 and out["simulated"]["error"] > 0.5
    assert out["predicted_speedup"] == out["simulated"]["speedup"] and out["advice"] == "keep"


@pytest.mark.parametrize("folder", CAPTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_profile_counts_each_forward_action_as_a_micro_batch_pass(folder: Path) -> None:
    """A profile holds no `forward` spans: its forward actions' ranges count the passes, so each stage's time per
    micro-batch is known and the stages compare by it, as the hook's run of the same job compares them."""
    from ppscope.analysis import analyze

    trace = open_trace(folder)
    result = analyze(trace)
    s = trace.spans
    steps = s[(s["phase"] == "F") & (s["mb"] >= 0)]["step"].nunique()
    assert result.imbalance_basis == "time_per_mb"
    assert NoticeCode.BUSY_IMBALANCE not in {w.code for w in result.warnings}
    for stage in result.stages:
        assert stage.units == pytest.approx(steps * trace.meta.microbatches), stage.stage
