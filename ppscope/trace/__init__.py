"""The trace model and the run store: the span schema, the recorder that writes spans, the per-rank SQLite
files a run keeps them in, and the clock offsets that put every rank on one time line."""

from typing import TYPE_CHECKING

from ppscope.exports import public_names

# public names: what other parts import (scripts/public_names.py)
if TYPE_CHECKING:
    from ppscope.trace.actions import BACKWARDS as BACKWARDS
    from ppscope.trace.actions import PASSES as PASSES
    from ppscope.trace.actions import Action as Action
    from ppscope.trace.actions import ActionType as ActionType
    from ppscope.trace.actions import StrEnum as StrEnum
    from ppscope.trace.clock import causality_violations as causality_violations
    from ppscope.trace.clock import estimate_offset as estimate_offset
    from ppscope.trace.clock import with_drift as with_drift
    from ppscope.trace.counterfile import read_rank_counters as read_rank_counters
    from ppscope.trace.layers import layer_indices as layer_indices
    from ppscope.trace.layers import layer_span_name as layer_span_name
    from ppscope.trace.model import COMM_KINDS as COMM_KINDS
    from ppscope.trace.model import COMPUTE_KINDS as COMPUTE_KINDS
    from ppscope.trace.model import SPAN_COLUMNS as SPAN_COLUMNS
    from ppscope.trace.model import ClockInfo as ClockInfo
    from ppscope.trace.model import Lane as Lane
    from ppscope.trace.model import Metric as Metric
    from ppscope.trace.model import Phase as Phase
    from ppscope.trace.model import RankInfo as RankInfo
    from ppscope.trace.model import RunMeta as RunMeta
    from ppscope.trace.model import SpanKind as SpanKind
    from ppscope.trace.model import Trace as Trace
    from ppscope.trace.model import counters_frame as counters_frame
    from ppscope.trace.model import empty_spans as empty_spans
    from ppscope.trace.model import lane_of as lane_of
    from ppscope.trace.model import requests_frame as requests_frame
    from ppscope.trace.model import spans_frame as spans_frame
    from ppscope.trace.notices import Notice as Notice
    from ppscope.trace.notices import NoticeCode as NoticeCode
    from ppscope.trace.notices import missing_ranks as missing_ranks
    from ppscope.trace.notices import rank_list as rank_list
    from ppscope.trace.outputs import atomic_file as atomic_file
    from ppscope.trace.outputs import atomic_folder as atomic_folder
    from ppscope.trace.outputs import check_output as check_output
    from ppscope.trace.rankfile import read_p2p as read_p2p
    from ppscope.trace.rankfile import read_sends as read_sends
    from ppscope.trace.rankfile import start_order as start_order
    from ppscope.trace.rankfile import text_column as text_column
    from ppscope.trace.recorder import KIND_COLORS as KIND_COLORS
    from ppscope.trace.recorder import Recorder as Recorder
    from ppscope.trace.schedules import Engine as Engine
    from ppscope.trace.schedules import Schedule as Schedule
    from ppscope.trace.store import DEMO_FILE as DEMO_FILE
    from ppscope.trace.store import META_FILE as META_FILE
    from ppscope.trace.store import REQUESTS_FILE as REQUESTS_FILE
    from ppscope.trace.store import RankWriter as RankWriter
    from ppscope.trace.store import RunTail as RunTail
    from ppscope.trace.store import check_new_run_dir as check_new_run_dir
    from ppscope.trace.store import create_run as create_run
    from ppscope.trace.store import damaged_note as damaged_note
    from ppscope.trace.store import each_rank as each_rank
    from ppscope.trace.store import failures_said as failures_said
    from ppscope.trace.store import is_run_dir as is_run_dir
    from ppscope.trace.store import load_run as load_run
    from ppscope.trace.store import rank_file_count as rank_file_count
    from ppscope.trace.store import read_meta as read_meta
    from ppscope.trace.store import read_rank_spans as read_rank_spans
    from ppscope.trace.store import read_requests as read_requests
    from ppscope.trace.store import read_since as read_since
    from ppscope.trace.store import run_files as run_files
    from ppscope.trace.store import span_count as span_count
    from ppscope.trace.store import write_meta as write_meta

_WHERE = {
    "Action": "actions",
    "ActionType": "actions",
    "BACKWARDS": "actions",
    "COMM_KINDS": "model",
    "COMPUTE_KINDS": "model",
    "ClockInfo": "model",
    "DEMO_FILE": "store",
    "Engine": "schedules",
    "KIND_COLORS": "recorder",
    "Lane": "model",
    "META_FILE": "store",
    "Metric": "model",
    "Notice": "notices",
    "NoticeCode": "notices",
    "PASSES": "actions",
    "Phase": "model",
    "REQUESTS_FILE": "store",
    "RankInfo": "model",
    "RankWriter": "store",
    "Recorder": "recorder",
    "RunMeta": "model",
    "RunTail": "store",
    "SPAN_COLUMNS": "model",
    "Schedule": "schedules",
    "SpanKind": "model",
    "StrEnum": "actions",
    "Trace": "model",
    "atomic_file": "outputs",
    "atomic_folder": "outputs",
    "causality_violations": "clock",
    "check_new_run_dir": "store",
    "check_output": "outputs",
    "counters_frame": "model",
    "create_run": "store",
    "damaged_note": "store",
    "each_rank": "store",
    "empty_spans": "model",
    "estimate_offset": "clock",
    "failures_said": "store",
    "is_run_dir": "store",
    "lane_of": "model",
    "layer_indices": "layers",
    "layer_span_name": "layers",
    "load_run": "store",
    "missing_ranks": "notices",
    "rank_file_count": "store",
    "rank_list": "notices",
    "read_meta": "store",
    "read_p2p": "rankfile",
    "read_rank_counters": "counterfile",
    "read_rank_spans": "store",
    "read_requests": "store",
    "read_sends": "rankfile",
    "read_since": "store",
    "requests_frame": "model",
    "run_files": "store",
    "span_count": "store",
    "spans_frame": "model",
    "start_order": "rankfile",
    "text_column": "rankfile",
    "with_drift": "clock",
    "write_meta": "store",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = public_names(__name__, _WHERE)
# end of public names
