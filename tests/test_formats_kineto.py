"""Kineto (PyTorch profiler) import: real per-rank files, both `ts` conventions, streaming, rank naming."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from test_formats_helpers import KINETO, fingerprint, need

import ppscope.formats.kineto.decode as kineto_json
from ppscope.formats.detect import InputKind, detect
from ppscope.formats.kineto.reader import load_kineto
from ppscope.formats.sources import open_trace
from ppscope.trace.notices import NoticeCode


def test_real_directory_of_two_ranks() -> None:
    folder = need(KINETO)
    before = fingerprint(folder)
    found = detect(folder)
    assert found.kind == InputKind.KINETO and len(found.files) == 2
    trace = open_trace(folder)
    assert fingerprint(folder) == before
    spans = trace.spans
    assert trace.ranks == [0, 1] and trace.stages == [0, 1]
    assert trace.meta.config["distributedInfo"]["world_size"] == 128
    for rank in (0, 1):
        mine = spans[spans["rank"] == rank]
        assert (mine["kind"] == "nccl").sum() == 10
        assert sorted(mine.loc[mine["kind"] == "step", "step"]) == [551, 552]
        gpu = mine[mine["kind"].isin(["kernel", "nccl", "memcpy", "memset"])]
        assert gpu["lane"].str.fullmatch(r"stream \d+").all()
        assert set(gpu["step"]) <= {551, 552} and (gpu["step"] >= 0).mean() > 0.9
    # absolute epoch µs -> ns: the first ProfilerStep of rank 0 starts at ts 1682725898079292 µs
    step = spans[(spans["rank"] == 0) & (spans["step"] == 551) & (spans["kind"] == "step")].iloc[0]
    assert step["start_ns"] == 1682725898079292 * 1000


def _write(path: Path, doc: dict, gz: bool = False) -> Path:
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def _doc(rank: int | None, base_ns: int | None, ts: float) -> dict:
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 1, "tid": 1, "ts": ts, "dur": 100},
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": ts + 1,
            "dur": 2,
            "args": {"correlation": 42},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "ncclDevKernel_SendRecv(x)",
            "pid": 0,
            "tid": 7,
            "ts": ts + 150,
            "dur": 10.5,
            "args": {"correlation": 42, "stream": 7},
        },
        {
            "ph": "X",
            "cat": "gpu_memcpy",
            "name": "Memcpy HtoD",
            "pid": 0,
            "tid": 9,
            "ts": ts + 3,
            "dur": 1,
            "args": {"bytes": 4096},
        },
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
    ]
    doc: dict = {"schemaVersion": 1, "traceEvents": events}
    if rank is not None:
        doc["distributedInfo"] = {"rank": rank, "world_size": 2, "backend": "nccl"}
    if base_ns is not None:
        doc["baseTimeNanoseconds"] = base_ns
    return doc


def test_relative_ts_with_base_and_absolute_ts_give_the_same_ns(tmp_path: Path) -> None:
    base = 1_700_000_000_123_456_789
    rel = load_kineto([_write(tmp_path / "a.json", _doc(0, base, 10.25))]).spans
    # The same instant in absolute µs, written as text: a float64 would lose the last ns digits.
    text = json.dumps(_doc(0, None, 0.0)).replace('"ts": 0.0,', '"ts": 1700000000123467.039,', 1)
    (tmp_path / "b.json").write_text(text)
    absolute = load_kineto([tmp_path / "b.json"]).spans
    step = rel[rel["kind"] == "step"].iloc[0]
    assert step["start_ns"] == base + 10_250 == 1_700_000_000_123_467_039
    assert absolute[absolute["kind"] == "step"].iloc[0]["start_ns"] == step["start_ns"]
    kern = rel[rel["kind"] == "nccl"].iloc[0]
    assert kern["end_ns"] - kern["start_ns"] == 10_500 and kern["lane"] == "stream 7"
    assert kern["step"] == 7  # launched inside ProfilerStep#7 although it ran after the step ended
    assert rel.loc[rel["kind"] == "memcpy", "nbytes"].tolist() == [4096]


def test_rank_from_file_name_and_from_distributed_info(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    _write(folder / "worker_rank_3.pt.trace.json.gz", _doc(None, None, 1000.0), gz=True)
    _write(folder / "host-a.json", _doc(5, None, 1000.0))
    trace = open_trace(folder)
    assert trace.ranks == [3, 5] and trace.stages == [0, 1]
    assert NoticeCode.STAGES_BY_FALLBACK in {w.code for w in trace.warnings}


def test_streaming_across_tiny_chunks_gives_the_same_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "r.json.gz", _doc(1, 5_000, 3.5), gz=True)
    whole = load_kineto([path]).spans
    monkeypatch.setattr(kineto_json, "_CHUNK", 7)
    pieces = load_kineto([path]).spans
    assert whole.equals(pieces) and len(whole) == 3


@pytest.mark.parametrize("chunk", [7, 333, 1 << 20])
def test_events_decoded_in_batches_are_those_of_a_plain_json_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Batches are cut at a `},` between events; one inside a name or a nested object must not cut them."""
    odd = [
        {"ph": "X", "cat": "cpu_op", "name": 'aten::x}, {"ph": "X"}', "pid": 1, "tid": 1, "ts": 5, "dur": 1.25},
        {
            "ph": "X",
            "cat": "kernel",
            "name": "k",
            "pid": 0,
            "tid": 7,
            "ts": 6,
            "dur": 2,
            "args": {"grid": {"x": 1}, "block": [{"y": 2}, {"z": 3}], "correlation": 9},
        },
        [1, 2],  # not an event: skipped
        {"ph": "i", "name": "}, ", "pid": 1, "tid": 1, "ts": 7.5},
    ]
    events = odd * 300
    for i, ev in enumerate(events):
        if isinstance(ev, dict):
            events[i] = {**ev, "ts": i}
    expected = [json.loads(json.dumps(e), parse_float=str) for e in events if isinstance(e, dict)]
    monkeypatch.setattr(kineto_json, "_CHUNK", chunk)
    for indent in (None, 2):  # on one line, and pretty-printed as Kineto writes it
        path = tmp_path / "odd.json"
        path.write_text(json.dumps({"traceEvents": events, "schemaVersion": 1}, indent=indent))
        top: dict = {}
        assert list(kineto_json.iter_trace_events(path, top)) == expected
        assert top == {"schemaVersion": 1}


def test_other_json_files_next_to_the_traces_are_skipped(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    _write(folder / "rank0.json", _doc(0, None, 10.0))
    (folder / "config.json").write_text('{"lr": 0.1}')
    trace = open_trace(folder)
    assert trace.ranks == [0]
    assert NoticeCode.SKIPPED_FILES in {w.code for w in trace.warnings}
