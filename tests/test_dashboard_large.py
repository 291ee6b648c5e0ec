"""The dashboard on a run of more rank files than it loads whole: the same figures, read a rank at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from error_helpers import raises_code

from ppscope.errors import ErrorCode

pytest.importorskip("streamlit")
from replica_helpers import replica_job
from test_dashboard_app import _app, _chart_specs, _decode, _span_bars

from ppscope.simulate.simulator import write_run
from ppscope.trace import store

LARGE = "--ranks-in-memory=4"  # the job below has 24 rank files: shown a rank at a time


def _page(at: Any) -> dict[str, Any]:
    """What a page shows: its charts, tables, metrics, headings and warnings."""
    return {
        "charts": _chart_specs(at),
        "tables": [d.value.to_dict("list") for d in at.dataframe],
        "metrics": [(m.label, m.value) for m in at.metric],
        "markdown": [m.value for m in at.markdown],
        "warnings": [w.value for w in at.warning],
        "errors": [e.value for e in at.error],
        "captions": [c.value.split(" Read a rank at a time")[0] for c in at.caption],
        "rank_at_a_time": any("Read a rank at a time" in c.value for c in at.caption),
    }


def _timeline_pages(run: Path, *args: str) -> list[dict[str, Any]]:
    at = _app(*args, run).run()  # type: ignore[arg-type]
    assert not at.exception, at.exception
    pages = [_page(at)]
    at.radio(key="color_by").set_value("kind").run()
    pages.append(_page(at))
    at.radio(key="lanes").set_value("One rank").run()
    at.selectbox(key="lane_rank").set_value(14).run()
    assert not at.exception, at.exception
    pages.append(_page(at))
    at.sidebar.radio(key="section").set_value("Stages").run()
    assert not at.exception, at.exception
    pages.append(_page(at))
    return pages


def test_a_large_run_shows_the_figures_of_the_whole_load(tmp_path: Path) -> None:
    trace = replica_job(3, 8, slow={(1, 6): 1.4})  # 24 ranks; rank 14 is stage 1's straggler
    whole = write_run(trace, tmp_path / "whole")
    large = write_run(trace, tmp_path / "large")
    for run in (whole, large):
        (run / "rank-00003.sqlite").unlink()  # a missing rank: replica 3 incomplete, in both
    expected = _timeline_pages(whole)
    got = _timeline_pages(large, LARGE)
    assert [p.pop("rank_at_a_time") for p in got[:3]] == [True] * 3
    assert [p.pop("rank_at_a_time") for p in expected] == [False] * 4
    got[3].pop("rank_at_a_time")
    assert got == expected
    assert len({y for t in _span_bars(got[0]["charts"][0]) for y in _decode(t["y"])}) == 4
    assert got[3]["metrics"][0] == ("Bottleneck", "stage 1, replica 6, rank 14")


def test_the_stage_view_reads_only_the_ranks_it_draws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = write_run(replica_job(3, 8, slow={(1, 6): 1.4}), tmp_path / "job")
    reads: list[list[int]] = []
    read_ranks = store.read_ranks

    def counting(files: dict[int, Path], *args: Any) -> Any:
        reads.append(sorted(files))
        return read_ranks(files, *args)

    monkeypatch.setattr(store, "read_ranks", counting)
    at = _app(Path(LARGE), run).run()
    assert not at.exception, at.exception
    drawn = {
        int(y.split(" · ")[0].removeprefix("rank ")) for t in _span_bars(_chart_specs(at)[0]) for y in _decode(t["y"])
    }
    # the analysis: each of the 24 files read alone, twice (digest, then its stage); the lanes: theirs at once
    assert sorted(r for r in reads if len(r) == 1) == sorted([[r] for r in range(24)] * 2)
    assert [r for r in reads if len(r) > 1] == [sorted(drawn)]
    assert len(drawn) == 4 and 14 in drawn  # 3 stages + the straggler, of 24 ranks
    reads.clear()
    at.radio(key="lanes").set_value("One rank").run()
    assert reads == [[0]]  # the first rank of the list, alone
    at.selectbox(key="lane_rank").set_value(5).run()
    assert not at.exception, at.exception
    assert reads == [[0], [5]]  # the picked rank alone, when picked
    reads.clear()
    at.sidebar.radio(key="section").set_value("Compare").run()
    assert not at.exception, at.exception
    assert reads == []  # the Compare page takes what the Timeline read (tests/test_dashboard_large_compare.py)
    assert any("Only one trace is open" in i.value for i in at.info)
    at.sidebar.checkbox(key="whole_run").check().run()
    assert not at.exception, at.exception
    assert [len(r) for r in reads][:1] == [24]  # asked for: the whole run, as a small one is loaded
    assert any("Compare two runs" in m.value for m in at.markdown)


def test_a_run_within_the_limit_is_loaded_whole_running_or_not(tmp_path: Path) -> None:
    from ppscope.dashboard.ranked import RankedRun

    run = write_run(replica_job(2, 3), tmp_path / "job")  # 6 rank files
    assert RankedRun.open(run, limit=6) is None
    big = RankedRun.open(run, limit=5)
    assert big is not None and big.ranks == list(range(6))
    import json

    meta = json.loads((run / "meta.json").read_text())
    (run / "meta.json").write_text(json.dumps({**meta, "status": "running"}))
    assert RankedRun.open(run, limit=6) is None
    live = RankedRun.open(run, limit=5)  # still written, and large: read again a rank at a time as it changes
    assert live is not None and live.live and not big.live


def test_a_large_run_is_opened_again_for_a_new_rank_file_not_for_a_log(tmp_path: Path) -> None:
    """SQLite's write-ahead logs appear and go as a running job's ranks open and close their files: the run
    shown is kept (its own refresh reads the ranks again when they change); a new rank file opens it anew."""
    import json
    import shutil

    from ppscope.dashboard.app import ranked_run
    from ppscope.dashboard.safety import Entry

    run = write_run(replica_job(2, 3), tmp_path / "job")
    meta = json.loads((run / "meta.json").read_text())
    (run / "meta.json").write_text(json.dumps({**meta, "status": "running"}))
    entry = Entry(label="job", path=run, is_run=True)
    first = ranked_run(entry, 4)
    assert first is not None and first.live
    (run / "rank-00002.sqlite-wal").write_bytes(b"")
    (run / "rank-00002.sqlite-shm").write_bytes(b"")
    assert ranked_run(entry, 4) is first
    shutil.copy(run / "rank-00005.sqlite", run / "rank-00006.sqlite")
    again = ranked_run(entry, 4)
    assert again is not None and again is not first and len(again.files) == 7


def test_the_limit_is_passed_to_the_app(tmp_path: Path) -> None:
    from ppscope.cli.commands.dashboard import dashboard_command
    from ppscope.dashboard.app import RANKS_OPTION, _limit
    from ppscope.errors import InvalidConfigError

    run = write_run(replica_job(2, 2), tmp_path / "job")
    cmd = dashboard_command([run], port=8600, ranks_in_memory=4)
    args = cmd[cmd.index("--") + 1 :]
    assert args == [f"{RANKS_OPTION}4", str(run)]
    assert _limit(args) == (4, [str(run)])
    assert _limit([str(run)]) == (256, [str(run)])
    with raises_code(InvalidConfigError, ErrorCode.BAD_VALUE):
        dashboard_command([run], ranks_in_memory=-1)


@pytest.mark.browser
@pytest.mark.slow
def test_chromium_draws_the_stage_view_of_a_large_run(tmp_path: Path) -> None:
    from test_dashboard_browser import _ALL_BARS_DRAWN, dashboard_page
    from test_dashboard_replicas import _ROWS_JS

    run = write_run(replica_job(4, 16, slow={(2, 9): 1.25}), tmp_path / "job")  # 64 ranks
    with dashboard_page(run, ranks_in_memory=8) as page:
        page.wait_for_function(_ALL_BARS_DRAWN, timeout=60_000)
        rows = page.evaluate(_ROWS_JS)
        text = page.inner_text("body")
    assert len(rows) == 5, rows  # 4 stages + 1 straggler, of 64 ranks
    assert "rank 41 · stage 2: ▲ straggler, replica 9 +25.0%" in rows
    assert "Read a rank at a time: 64 rank files" in text
