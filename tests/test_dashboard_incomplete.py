"""The dashboard on a run with a rank's file missing: its loader and its Stages page name the rank in the words
`ppscope analyze` uses, once, with what that withholds."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from test_dashboard_app import _app

from ppscope.analysis import analyze
from ppscope.analysis.report import incomplete_line
from ppscope.balance.costs import LayerCosts
from ppscope.dashboard.data import LiveTrace
from ppscope.dashboard.safety import md
from ppscope.simulate.simulator import SimConfig, simulate, write_run
from ppscope.trace.notices import NoticeCode


def test_the_stages_page_names_the_missing_rank_once(tmp_path: Path) -> None:
    cfg = SimConfig(schedule="gpipe", stages=4, microbatches=4, costs=LayerCosts.uniform(8, 1.0))
    run = write_run(simulate(cfg), tmp_path / "sim")
    (run / "rank-00002.sqlite").unlink()
    loaded = LiveTrace(run, is_run=True).refresh()
    named = analyze(loaded).missing
    assert named is not None and named in loaded.warnings  # the loader's notice is the analysis's
    at = _app(run).run()
    at.sidebar.radio(key="section").set_value("Stages").run()
    assert not at.exception, at.exception
    said = [w.value for w in at.warning] + [c.value for c in at.caption]
    assert named.code == NoticeCode.MISSING_RANKS and "rank 2 " in named.text  # the rank
    assert sum(md(named.text) in s for s in said) == 1, said  # named once, on the Stages page
    line = incomplete_line(analyze(loaded))
    assert any(w.value == md(line[:1].upper() + line[1:]) for w in at.warning), said  # with what it withholds
    assert at.metric[0].value == "—"  # the bubble ratio: unknown
