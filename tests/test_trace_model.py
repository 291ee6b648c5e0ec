"""The trace model: schema, kinds, metadata round trip and validation."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from error_helpers import raises_code

from ppscope.errors import CorruptFileError, ErrorCode, InvalidSpanError, SchemaVersionError
from ppscope.trace.model import (
    SCHEMA_VERSION,
    SPAN_COLUMNS,
    ClockInfo,
    Lane,
    RankInfo,
    RunMeta,
    SpanKind,
    Trace,
    lane_of,
    spans_frame,
)


def test_span_kinds_are_strings() -> None:
    assert SpanKind.FORWARD == "forward"
    assert str(SpanKind.RECV_WAIT) == "recv_wait"
    assert f"{SpanKind.SEND}" == "send"
    assert lane_of(SpanKind.RECV_WAIT) == Lane.RECV
    assert lane_of(SpanKind.FORWARD) == "compute"


def test_empty_frame_has_schema_dtypes() -> None:
    df = spans_frame()
    assert list(df.columns) == list(SPAN_COLUMNS)
    assert df["start_ns"].dtype == np.int64
    assert df["rank"].dtype == np.int32


def test_from_records_fills_defaults_and_lanes() -> None:
    t = Trace.from_records(
        [
            {"rank": 1, "stage": 1, "kind": SpanKind.RECV_WAIT, "start_ns": 5, "end_ns": 9, "peer": 0},
            {"kind": "forward", "start_ns": 0, "end_ns": 4, "mb": 3},
        ]
    )
    spans = t.spans
    assert spans.loc[0, "lane"] == "recv" and spans.loc[0, "name"] == "recv_wait"
    assert spans.loc[1, "lane"] == "compute" and spans.loc[1, "mb"] == 3 and spans.loc[1, "peer"] == -1
    assert t.sorted().spans["start_ns"].tolist() == [0, 5]
    assert t.ranks == [0, 1] and t.stages == [1]


def test_from_records_rejects_unknown_field() -> None:
    with raises_code(InvalidSpanError, ErrorCode.UNKNOWN_SPAN_FIELD):
        Trace.from_records([{"kind": "forward", "start": 1}])


def test_end_before_start_is_rejected() -> None:
    with raises_code(InvalidSpanError, ErrorCode.SPAN_REVERSED):
        Trace.from_records([{"kind": "forward", "start_ns": 10, "end_ns": 9}])


def test_missing_column_is_an_error() -> None:
    with raises_code(CorruptFileError, ErrorCode.MISSING_COLUMNS):
        spans_frame(pd.DataFrame({"rank": [0]}))


def test_meta_json_round_trip() -> None:
    meta = RunMeta(
        run_id="r1",
        world_size=2,
        pp_size=2,
        schedule="gpipe",
        microbatches=4,
        split=[3, 5],
        split_source="--split",
        model={"name": "tiny", "layers": 8},
        ranks=[RankInfo(rank=1, stage=1, host="h", clock=ClockInfo(offset_ns=-42, uncertainty_ns=7, method="x"))],
        config={"max_inflight": 2},
    )
    back = RunMeta.from_json(meta.to_json())
    assert back == meta
    info = back.rank_info(1)
    assert info is not None and info.clock.offset_ns == -42
    assert back.rank_info(5) is None


def test_meta_from_newer_schema_is_refused() -> None:
    text = json.dumps({"schema_version": SCHEMA_VERSION + 1})
    with raises_code(SchemaVersionError, ErrorCode.SCHEMA_TOO_NEW):
        RunMeta.from_json(text, where="meta.json")


@pytest.mark.parametrize(
    "payload",
    [
        "[1, 2]",
        '{"world_size": "two"}',
        '{"split": [1, "x"]}',
        '{"ranks": [{"rank": 0, "clock": 5}]}',
        '{"ranks": [{"rank": 0, "bogus": 1}]}',
        '{"schema_version": "1"}',
        "{not json",
    ],
)
def test_malformed_meta_is_a_corrupt_file(payload: str) -> None:
    with pytest.raises(CorruptFileError):
        RunMeta.from_json(payload, where="meta.json")


def test_unknown_meta_fields_are_ignored() -> None:
    meta = RunMeta.from_json(json.dumps({"world_size": 3, "future_field": {"a": 1}}))
    assert meta.world_size == 3


def test_a_run_of_schema_1_still_reads() -> None:
    # written by an older ppscope: no replica, no SM clock, no counters, a clock without drift
    text = json.dumps({"schema_version": 1, "world_size": 1, "ranks": [{"rank": 0, "stage": 0, "clock": {}}]})
    meta = RunMeta.from_json(text)
    assert (meta.schema_version, meta.ranks[0].replica, meta.ranks[0].sm_clock_mhz) == (1, -1, 0.0)


def test_sorted_orders_by_start_rank_end_and_keeps_a_sorted_trace_as_it_is() -> None:
    rows = [
        {"rank": 1, "start_ns": 5, "end_ns": 9, "name": "a"},
        {"rank": 0, "start_ns": 5, "end_ns": 7, "name": "b"},
        {"rank": 0, "start_ns": 5, "end_ns": 6, "name": "c"},
        {"rank": 0, "start_ns": 5, "end_ns": 6, "name": "d"},  # a tie on every key: after c, as given
        {"rank": 2, "start_ns": 1, "end_ns": 2, "name": "e"},
    ]
    once = Trace.from_records(rows).sorted()
    assert once.spans["name"].tolist() == ["e", "c", "d", "b", "a"]
    twice = once.sorted()
    pd.testing.assert_frame_equal(twice.spans, once.spans)
    twice.spans["name"] = "changed"  # the frames are the trace's own: the first trace keeps its names
    assert once.spans["name"].tolist() == ["e", "c", "d", "b", "a"]
    shuffled = Trace(spans=once.spans.iloc[[4, 0, 1, 2, 3]])  # in no order, and not indexed 0..n-1
    pd.testing.assert_frame_equal(shuffled.sorted().spans, once.spans)
    gapped = Trace(spans=once.spans.set_axis([10, 11, 12, 13, 14]))  # in order, not indexed 0..n-1
    pd.testing.assert_frame_equal(gapped.sorted().spans, once.spans)
