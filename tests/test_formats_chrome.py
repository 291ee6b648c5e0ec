"""Chrome/Perfetto export: processes per rank, nesting threads, send->recv flows, counters, gzip."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
from error_helpers import raises_code
from hypothesis import given, settings
from hypothesis import strategies as st
from test_formats_helpers import MFU, make_run, need

from ppscope.errors import ErrorCode
from ppscope.formats.chrome.writer import export_chrome, match_flows
from ppscope.formats.nesting import nests, stack_levels
from ppscope.formats.nsys.reader import load_nsys
from ppscope.trace.model import Trace
from ppscope.trace.store import load_run


def _events(path: Path) -> list[dict]:
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        assert raw[:2] == b"\x1f\x8b"
        raw = gzip.decompress(raw)
    return json.loads(raw)["traceEvents"]


def _check_nesting(events: list[dict]) -> None:
    by_thread: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            by_thread[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for key, iv in by_thread.items():
        a = np.array(iv)
        # compare in integer ns: the JSON holds µs with 3 decimals
        s, e = np.round(a[:, 0] * 1000).astype(np.int64), np.round(a[:, 1] * 1000).astype(np.int64)
        assert nests(s, e), f"slices on thread {key} overlap without nesting"


def test_run_export_has_ranks_lanes_flows_and_counters(tmp_path: Path) -> None:
    trace = load_run(make_run(tmp_path / "run"))
    events = _events(export_chrome(trace, tmp_path / "run.json.gz"))
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: "rank 0 / stage 0", 1: "rank 1 / stage 1", 2: "rank 2 / stage 2"}
    sort = {e["pid"]: e["args"]["sort_index"] for e in events if e["name"] == "process_sort_index"}
    assert sort == {0: 0, 1: 1, 2: 2}
    threads = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert {(0, "compute"), (0, "send"), (0, "host"), (1, "recv")} <= threads
    _check_nesting(events)
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == len(ends) == 2 * 4  # 4 micro-batches over 2 hops
    for fid, s in starts.items():
        f = ends[fid]
        assert (s["cat"], s["name"]) == (f["cat"], f["name"]) and f["bp"] == "e"
        assert f["pid"] == s["pid"] + 1 and f["ts"] >= s["ts"]
    counters = [e for e in events if e["ph"] == "C"]
    assert len(counters) == 15 and all("cpu_util_pct" in e["args"] for e in counters)
    xs = [e for e in events if e["ph"] == "X"]
    assert len(xs) + sum(e["ph"] == "i" for e in events) == len(trace.spans)


def test_overlapping_spans_on_one_lane_are_split_into_nesting_threads(tmp_path: Path) -> None:
    trace = Trace.from_records(
        [
            {"rank": 0, "kind": "forward", "start_ns": 0, "end_ns": 100},
            {"rank": 0, "kind": "forward", "start_ns": 50, "end_ns": 150},
            {"rank": 0, "kind": "forward", "start_ns": 60, "end_ns": 70},
        ]
    )
    events = _events(export_chrome(trace, tmp_path / "t.json"))
    _check_nesting(events)
    assert sorted(e["args"]["name"] for e in events if e["name"] == "thread_name") == ["compute", "compute #2"]


def test_flow_matching_pairs_nth_send_with_nth_receive() -> None:
    trace = Trace.from_records(
        [
            {"rank": 0, "kind": "send", "mb": 1, "peer": 1, "start_ns": 10, "end_ns": 20},
            {"rank": 0, "kind": "send", "mb": 1, "peer": 1, "start_ns": 30, "end_ns": 40},
            {"rank": 1, "kind": "recv_wait", "mb": 1, "peer": 0, "start_ns": 5, "end_ns": 25},
            {"rank": 1, "kind": "recv_wait", "mb": 1, "peer": 0, "start_ns": 28, "end_ns": 45},
            {"rank": 1, "kind": "recv_wait", "mb": 2, "peer": 0, "start_ns": 50, "end_ns": 60},
        ]
    )
    spans = trace.spans
    pairs = [(int(spans.loc[s, "start_ns"]), int(spans.loc[r, "start_ns"])) for s, r in match_flows(spans)]
    assert sorted(pairs) == [(10, 5), (30, 28)]


def test_real_nsys_import_exports_with_nesting_threads(tmp_path: Path) -> None:
    trace = load_nsys(need(MFU))
    events = _events(export_chrome(trace, tmp_path / "mfu.json"))
    _check_nesting(events)
    assert {e["args"]["name"] for e in events if e["name"] == "process_name"} == {
        "rank 0 / stage 0",
        "rank 1 / stage 1",
    }


def test_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    from ppscope.errors import RunExistsError

    out = tmp_path / "x.json"
    out.write_text("keep")
    trace = Trace.from_records([{"rank": 0, "kind": "forward", "start_ns": 0, "end_ns": 1}])
    with raises_code(RunExistsError, ErrorCode.RUN_EXISTS):
        export_chrome(trace, out)
    assert out.read_text() == "keep"
    export_chrome(trace, out, force=True)
    assert _events(out)


@given(st.lists(st.tuples(st.integers(0, 1_000), st.integers(0, 300)), min_size=1, max_size=60))
@settings(max_examples=60, deadline=None)
def test_stack_levels_always_nest(pairs: list[tuple[int, int]]) -> None:
    starts = np.array([s for s, _ in pairs], dtype=np.int64)
    ends = starts + np.array([d for _, d in pairs], dtype=np.int64)
    levels = stack_levels(starts, ends)
    for level in set(levels.tolist()):
        assert nests(starts[levels == level], ends[levels == level])
    if nests(starts, ends):
        assert set(levels.tolist()) == {0}
