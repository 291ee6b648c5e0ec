"""Bad inputs give a clear message or a warning in the result, never a traceback."""

from __future__ import annotations

import pytest
from error_helpers import raises_code

from ppscope.analysis import AnalysisConfig, analyze, parse_window_ms
from ppscope.errors import ErrorCode, InvalidConfigError
from ppscope.trace.model import RunMeta, Trace
from ppscope.trace.notices import Notice, NoticeCode


def _fwd(rank: int, start: int, end: int) -> dict[str, object]:
    return dict(rank=rank, stage=rank, kind="forward", mb=0, start_ns=start, end_ns=end)


def _codes(notices: list[Notice]) -> list[NoticeCode]:
    return [n.code for n in notices]


def test_empty_trace_is_a_warning() -> None:
    res = analyze(Trace())
    assert res.stages == [] and res.bubble_ratio is None
    assert _codes(res.warnings) == [NoticeCode.NO_SPANS]
    assert res.to_json()["window_ns"] == 0


def test_single_stage() -> None:
    res = analyze(Trace.from_records([_fwd(0, 0, 10), _fwd(0, 20, 30)]))
    assert res.pp_size == 1 and res.imbalance == 0.0
    assert NoticeCode.ONE_STAGE in _codes(res.warnings)


def test_missing_ranks_warned() -> None:
    meta = RunMeta(world_size=4, pp_size=4)
    res = analyze(Trace.from_records([_fwd(0, 0, 10), _fwd(2, 10, 20)], meta=meta))
    assert [s.stage for s in res.stages] == [0, 2]
    assert res.missing is not None and res.missing.code == NoticeCode.MISSING_RANKS
    assert "1, 3 " in res.missing.text and "4" in res.missing.text  # names them, of how many
    assert res.pp_size == 4 and res.unknown_stages == [1, 3] and res.bubble_ratio is None
    assert res.imbalance is None and res.balance_speedup is None


def test_window_outside_trace_raises_clear_error() -> None:
    tr = Trace.from_records([_fwd(0, 0, 10**6)])
    with raises_code(InvalidConfigError, ErrorCode.WINDOW_OUTSIDE_TRACE):
        analyze(tr, AnalysisConfig(window_ms=(5.0, 6.0)))
    res = analyze(tr, AnalysisConfig(window_ms=(0.5, 6.0)))
    assert res.window is not None and res.window.length_ns == 5 * 10**5
    assert NoticeCode.WINDOW_CLIPPED in _codes(res.warnings)


@pytest.mark.parametrize("text", ["5", "a:b", "5:1", "1:2:3", "-1:2", "nan:3"])
def test_bad_window_text(text: str) -> None:
    with pytest.raises(InvalidConfigError):
        parse_window_ms(text)


def test_steady_and_window_together_refused() -> None:
    with raises_code(InvalidConfigError, ErrorCode.CONFLICTING_OPTIONS):
        AnalysisConfig(steady=True, window_ms=(0, 1))


def test_no_steady_state_falls_back_with_warning() -> None:
    # Two stages that never compute at the same time: no steady state.
    res = analyze(Trace.from_records([_fwd(0, 0, 10), _fwd(1, 10, 20)]), AnalysisConfig(steady=True))
    assert res.window is not None and res.window.mode == "full"
    assert NoticeCode.NO_STEADY_STATE in _codes(res.warnings)


def test_instantaneous_trace() -> None:
    res = analyze(Trace.from_records([dict(rank=0, kind="mark", start_ns=5, end_ns=5)]))
    assert res.bubble_ratio is None and _codes(res.warnings) == [NoticeCode.ZERO_LENGTH]


def test_loader_warnings_are_kept() -> None:
    tr = Trace.from_records([_fwd(0, 0, 10)])
    loaded = Notice(NoticeCode.DAMAGED_FILE, "rank 1's file is damaged")
    tr.warnings.append(loaded)
    assert loaded in analyze(tr).warnings


def test_failed_run_is_said() -> None:
    meta = RunMeta(status="failed", error="rank 1 failed: boom")
    res = analyze(Trace.from_records([_fwd(0, 0, 10)], meta=meta))
    (failed,) = [n.text for n in res.warnings if n.code == NoticeCode.RUN_FAILED]
    assert failed.endswith("(rank 1 failed: boom)")  # the cause, as the run recorded it


@pytest.mark.parametrize(("source", "names"), [("ppscope", ()), ("pipelining", ("record_pipeline",))])
def test_a_run_still_marked_running_is_said_a_snapshot(source: str, names: tuple[str, ...]) -> None:
    res = analyze(Trace.from_records([_fwd(0, 0, 10)], meta=RunMeta(status="running", source=source)))
    (running,) = [n.text for n in res.warnings if n.code == NoticeCode.RUN_RUNNING]
    assert all(name in running for name in names)  # a job that never closed its recorder: the call that does
    # a trace made in memory or imported says nothing of a status it never had
    quiet = analyze(Trace.from_records([_fwd(0, 0, 10)], meta=RunMeta(status="running", source="unknown")))
    assert NoticeCode.RUN_RUNNING not in _codes(quiet.warnings)
