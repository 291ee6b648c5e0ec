"""torch.distributed.pipelining in Kineto traces, on small hand-made files whose every time is known: action
ranges to stages and micro-batches, waits inside actions to `recv_wait`, CPU operators to compute, GPU
kernels to the action that launched them, and bad input (empty files, another job's file, unknown actions)
named in one line."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from error_helpers import cli_error

from ppscope.analysis import analyze
from ppscope.cli.main import main
from ppscope.errors import ErrorCode
from ppscope.formats.sources import open_trace
from ppscope.trace.notices import NoticeCode

BASE = 1_790_000_000_000_000_000


def _x(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": 7, "ts": ts, "dur": dur, "args": args}


def _ann(name: str, ts: float, dur: float) -> dict[str, Any]:
    return _x("user_annotation", name, ts, dur)


def _op(name: str, ts: float, dur: float) -> dict[str, Any]:
    return _x("cpu_op", name, ts, dur)


def _doc(rank: int, events: list[dict[str, Any]], world: int = 2) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world},
        "baseTimeNanoseconds": BASE,
        "traceEvents": events,
    }


def gpipe_cpu() -> dict[int, list[dict[str, Any]]]:
    """Two ranks, one stage each, two micro-batches, torch's runtime ranges (µs)."""
    r0 = [
        _ann("ProfilerStep#0", 0, 700),
        _ann("PP:0F0", 0, 100),
        _op("aten::linear", 10, 30),
        _op("aten::gelu", 50, 40),
        _ann("PP:0SEND_F0", 100, 10),
        _op("c10d::send", 102, 6),
        _ann("PP:0F1", 110, 90),
        _op("aten::linear", 120, 70),
        _ann("PP:0SEND_F1", 200, 10),
        _op("c10d::send", 202, 6),
        _ann("PP:0RECV_B1", 210, 5),
        _op("c10d::recv_", 211, 3),
        _ann("gloo:recv", 212, 188),
        _ann("PP:0B1", 220, 280),
        _op("autograd::engine::evaluate_function: AddmmBackward0", 410, 80),
        _ann("PP:0RECV_B0", 500, 5),
        _ann("gloo:recv", 502, 18),
        _ann("PP:0B0", 510, 90),
        _op("autograd::engine::evaluate_function: AddmmBackward0", 530, 60),
        _op("aten::add_", 650, 20),  # the optimizer, outside every action
    ]
    r1 = [
        _ann("ProfilerStep#0", 0, 700),
        _ann("PP:1RECV_F0", 0, 5),
        _ann("gloo:recv", 2, 106),
        _ann("PP:1F0", 10, 190),
        _op("aten::linear", 120, 60),
        _ann("PP:1RECV_F1", 200, 5),
        _ann("gloo:recv", 201, 9),
        _ann("PP:1F1", 206, 94),
        _op("aten::linear", 220, 60),
        _ann("PP:1B1", 300, 100),
        _op("autograd::engine::evaluate_function: AddmmBackward0", 310, 80),
        _ann("PP:1SEND_B1", 400, 10),
        _op("c10d::send", 401, 5),
        _ann("PP:1B0", 410, 80),
        _op("autograd::engine::evaluate_function: AddmmBackward0", 420, 60),
        _ann("PP:1SEND_B0", 490, 10),
        _op("c10d::send", 491, 5),
    ]
    return {0: r0, 1: r1}


def _write(folder: Path, docs: dict[int, list[dict[str, Any]]], world: int = 2) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for rank, events in docs.items():
        (folder / f"rank-{rank}.json.gz").write_bytes(gzip.compress(json.dumps(_doc(rank, events, world)).encode()))
    return folder


def _ns(us: float) -> int:
    return BASE + int(us * 1000)


def test_waits_inside_actions_are_recv_wait_and_operators_are_compute(tmp_path: Path) -> None:
    trace = open_trace(_write(tmp_path / "t", gpipe_cpu()))
    meta, spans = trace.meta, trace.spans
    assert (meta.schedule, meta.microbatches, meta.chunks, meta.pp_size) == ("gpipe", 2, 1, 2)
    assert meta.config["pipelining"]["placement"] == "single"
    waits = spans[spans["kind"] == "recv_wait"].sort_values(["rank", "start_ns"])
    got = [
        (int(r), int(s), int(m), p, int(a), int(b), int(q))
        for r, s, m, p, a, b, q in waits[["rank", "stage", "mb", "phase", "start_ns", "end_ns", "peer"]].itertuples(
            index=False
        )
    ]
    assert got == [
        (0, 0, 1, "B", _ns(220), _ns(400), 1),  # waited from the action's start to its receive's completion
        (0, 0, 0, "B", _ns(510), _ns(520), 1),
        (1, 1, 0, "F", _ns(10), _ns(108), 0),
        (1, 1, 1, "F", _ns(206), _ns(210), 0),
    ]
    compute = spans[(spans["kind"] == "kernel") & (spans["rank"] == 0)].sort_values("start_ns")
    assert list(compute["mb"]) == [0, 0, 1, 1, 0] and list(compute["phase"]) == ["F", "F", "F", "B", "B"]
    # the operator outside every action is the training loop's own work: host, not the pipeline's compute
    outside = spans[(spans["kind"] == "host") & (spans["rank"] == 0)]
    assert list(outside["mb"]) == [-1] and list(outside["phase"]) == [""]
    sends = spans[spans["kind"] == "send"].sort_values(["rank", "start_ns"])
    assert list(zip(sends["rank"], sends["peer"], sends["mb"], strict=True)) == [
        (0, 1, 0),
        (0, 1, 1),
        (1, 0, 1),
        (1, 0, 0),
    ]
    action = spans[(spans["name"] == "PP:0B1") & (spans["kind"] == "range")].iloc[0]
    assert (action["kind"], action["stage"], action["mb"], action["step"], action["phase"]) == ("range", 0, 1, 0, "B")
    result = analyze(trace)
    stage0 = result.stages[0]
    # the waits inside the actions are idle, not busy: in a GPipe step they lie between the forward wave and the
    # backward one, so they are that step's drain and fill (ppscope.analysis.steps), not upstream
    waits = stage0.causes["upstream"] + stage0.causes["fill"] + stage0.causes["drain"]
    assert waits >= (400 - 220 + 520 - 510) * 1000 and stage0.busy_ns < (stage0.busy_ns + stage0.bubble_ns)
    assert NoticeCode.IMPORT_CLOCKS in {w.code for w in result.warnings}


def test_gaps_between_operators_inside_an_action_are_the_ranks_work_on_a_cpu(tmp_path: Path) -> None:
    trace = open_trace(_write(tmp_path / "t", gpipe_cpu()))
    result = analyze(trace)
    stage0, stage1 = result.stages
    # rank 0 computes 30+40+70+80+60 µs in its actions (its 20 µs operator outside them is the loop's, not the
    # pipeline's); on a CPU the rank's thread is the device, so the gaps between the operators of an action that
    # no wait explains are its work too: F0 [0,10) [40,50) [90,100), F1 [110,120) [190,200), B1 [400,410)
    # [490,500), B0 [520,530) [590,600), 90 µs; rank 1: F0 [108,120) [180,200), F1 [210,220) [280,300), B1 and B0
    # 10+10, 102 µs
    assert stage0.busy_ns == 280_000 + 90_000
    assert (stage0.causes["host"], stage1.causes["host"]) == (0, 0)
    # on a GPU they are the host's: the device waits for the next launch
    ranks = [dataclasses.replace(r, device="cuda") for r in trace.meta.ranks]
    on_gpu = analyze(dataclasses.replace(trace, meta=dataclasses.replace(trace.meta, ranks=ranks)))
    assert (on_gpu.stages[0].causes["host"], on_gpu.stages[1].causes["host"]) == (90_000, 102_000)
    assert on_gpu.stages[0].busy_ns == 280_000
    # the rest of the idle time (waits, and outside the actions) is the step's fill and drain: never `unknown`
    for s in (stage0, stage1):
        assert s.causes["fill"] + s.causes["drain"] + s.causes["host"] == s.bubble_ns and s.causes["unknown"] == 0


def test_single_stage_ranges_and_inferred_actions(tmp_path: Path) -> None:
    docs = gpipe_cpu()
    rename = {
        "PP:0F0": "Forward 0",
        "PP:0F1": "Forward 1",
        "PP:0B1": "Backward 1",
        "PP:0B0": "Backward 0",
        "PP:1F0": "Forward 0",
        "PP:1F1": "Forward 1",
        "PP:1B1": "Backward 1",
        "PP:1B0": "Backward 0",
    }
    for events in docs.values():
        for e in events:
            e["name"] = rename.get(e["name"], e["name"])
    trace = open_trace(_write(tmp_path / "t", docs))
    assert trace.meta.schedule == "gpipe" and trace.meta.microbatches == 2
    assert NoticeCode.STAGELESS_ACTIONS in {w.code for w in trace.warnings}
    assert sorted(trace.spans.loc[trace.spans["kind"] == "recv_wait", "peer"]) == [0, 0, 1, 1]


def test_an_unknown_action_is_a_warning_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = gpipe_cpu()
    docs[1].append(_ann("PP:1FOO3", 600, 10))
    folder = _write(tmp_path / "t", docs)
    assert main(["analyze", str(folder), "--json"]) == 0
    out = capsys.readouterr()
    (unknown,) = [w["text"] for w in json.loads(out.out)["warnings"] if w["code"] == NoticeCode.UNKNOWN_ACTIONS]
    assert "rank-1.json.gz" in unknown and "PP:1FOO3" in unknown  # the file, and the action
    assert "Traceback" not in out.err


def test_a_file_of_another_job_is_left_out_with_a_warning(tmp_path: Path) -> None:
    docs = gpipe_cpu()
    folder = _write(tmp_path / "t", docs)
    (folder / "rank-5.json.gz").write_bytes(gzip.compress(json.dumps(_doc(5, docs[0], world=8)).encode()))
    trace = open_trace(folder)
    assert trace.ranks == [0, 1]
    (other,) = [n.text for n in trace.warnings if n.code == NoticeCode.OTHER_JOB]
    assert "rank-5.json.gz" in other  # names the file


def test_files_that_do_not_overlap_in_time_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = gpipe_cpu()
    for e in docs[1]:
        e["ts"] += 10_000_000  # ten seconds later
    folder = _write(tmp_path / "t", docs)
    failed = cli_error(capsys, ["analyze", str(folder)])
    assert failed.exit_code == 2 and failed.code == ErrorCode.NOT_ONE_JOB
    assert failed.err.count("\n") == 1 and "rank-0.json.gz" in failed.text


@pytest.mark.parametrize("content", [b"", gzip.compress(b"")])
def test_an_empty_rank_file_is_named_as_empty(
    tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _write(tmp_path / "t", {1: gpipe_cpu()[1]})
    (folder / "rank-0.json.gz").write_bytes(content)
    failed = cli_error(capsys, ["analyze", str(folder)])
    assert failed.code == ErrorCode.EMPTY_FILE and failed.err.count("\n") == 1 and "rank-0.json.gz" in failed.text
    only = tmp_path / "rank-0.json.gz"
    only.write_bytes(content)
    failed = cli_error(capsys, ["analyze", str(only)])
    assert failed.code == ErrorCode.EMPTY_FILE and failed.err.count("\n") == 1 and str(only) in failed.text


def test_a_truncated_rank_file_is_named_and_the_rest_analysed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _write(tmp_path / "t", gpipe_cpu())
    data = (folder / "rank-1.json.gz").read_bytes()
    (folder / "rank-1.json.gz").write_bytes(data[: len(data) // 2])
    assert main(["analyze", str(folder), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["missing"]["code"] == NoticeCode.MISSING_RANKS and "rank 1 " in report["missing"]["text"]
    (damaged,) = [w["text"] for w in report["warnings"] if w["code"] == NoticeCode.DAMAGED_FILE]
    assert "rank-1.json.gz" in damaged  # the file left out
    assert main(["analyze", str(folder)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"incomplete: {report['missing']['text']}") and damaged in out, out  # leads the report
    (folder / "rank-0.json.gz").unlink()  # nothing else to read: the damage is the error, in one line
    failed = cli_error(capsys, ["analyze", str(folder)])
    assert failed.code == ErrorCode.DAMAGED_FILE and failed.err.count("\n") == 1 and "rank-1.json.gz" in failed.text


def test_gpu_kernels_take_the_action_that_launched_them(tmp_path: Path) -> None:
    def launch(ts: float, corr: int) -> dict[str, Any]:
        return _x("cuda_runtime", "cudaLaunchKernel", ts, 2, correlation=corr)

    def kernel(name: str, ts: float, dur: float, corr: int) -> dict[str, Any]:
        return {
            "ph": "X",
            "cat": "kernel",
            "name": name,
            "pid": 0,
            "tid": 7,
            "ts": ts,
            "dur": dur,
            "args": {"correlation": corr, "stream": 7},
        }

    r0 = [
        _ann("PP:0F0", 0, 50),
        launch(10, 1),
        kernel("gemm", 20, 40, 1),
        _ann("PP:0RECV_B0", 60, 10),
        launch(62, 2),
        kernel("ncclDevKernel_SendRecv", 65, 200, 2),
        _ann("PP:0B0", 80, 30),
        launch(85, 3),
        kernel("gemm_bwd", 270, 50, 3),
    ]
    r1 = [
        _ann("PP:1RECV_F0", 0, 10),
        launch(2, 1),
        kernel("ncclDevKernel_SendRecv", 5, 80, 1),
        _ann("PP:1F0", 20, 30),
        launch(25, 2),
        kernel("gemm", 90, 40, 2),
        _ann("PP:1B0", 60, 30),
        launch(65, 3),
        kernel("gemm_bwd", 140, 80, 3),
    ]
    trace = open_trace(_write(tmp_path / "t", {0: r0, 1: r1}))
    spans = trace.spans
    k = spans[spans["kind"] == "kernel"].sort_values(["rank", "start_ns"])
    assert list(zip(k["rank"], k["mb"], k["phase"], k["stage"], strict=True)) == [
        (0, 0, "F", 0),
        (0, 0, "B", 0),
        (1, 0, "F", 1),
        (1, 0, "B", 1),
    ]
    w = spans[spans["kind"] == "recv_wait"].sort_values("rank")
    assert list(zip(w["rank"], w["peer"], w["lane"], strict=True)) == [(0, 1, "stream 7"), (1, 0, "stream 7")]
    causes = analyze(trace).stages[0].causes  # the receive wait: upstream, or fill/drain at the step's edges
    assert causes["upstream"] + causes["fill"] + causes["drain"] > 0 and causes["unknown"] == 0


def test_files_read_in_worker_processes_give_the_same_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ppscope.formats.kineto.reader as kineto

    folder = _write(tmp_path / "t", gpipe_cpu())
    (folder / "summary.json").write_text('{"not": "a trace"}')  # skipped, in a worker as here
    here = open_trace(folder)
    monkeypatch.setattr(kineto, "_PARALLEL_BYTES", 0)  # any size: worker processes
    assert kineto._workers(sorted(folder.iterdir())) == min(3, os.cpu_count() or 1)
    there = open_trace(folder)
    pd.testing.assert_frame_equal(here.spans, there.spans)
    assert here.meta.to_dict() == there.meta.to_dict() and here.warnings == there.warnings
