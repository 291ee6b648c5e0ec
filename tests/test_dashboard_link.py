"""A link opens the dashboard where it says (`?section=Compare&trace=A&compare_with=B`), as `ppscope demo`'s does
on the comparison of its two splits; a name the dashboard does not offer is ignored."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest
from test_dashboard_runs import record_gpipe_run

TIMEOUT_S = 60


def _app(folder: Path, **query: str) -> AppTest:
    def script(argv: list[str]) -> None:
        from ppscope.dashboard.app import main

        main(argv)

    at = AppTest.from_function(script, args=([str(folder)],), default_timeout=TIMEOUT_S)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def test_a_link_opens_compare_on_run_1_against_run_2(tmp_path: Path) -> None:
    folder = tmp_path / "demo-1"
    for name in ("1-before", "2-after", "3-after"):  # the newest run is listed first: not what the link opens
        record_gpipe_run(folder / name, p=2, m=2)
    at = _app(folder, section="Compare", trace="demo-1/1-before", compare_with="demo-1/2-after")
    assert not at.exception, at.exception
    assert at.sidebar.selectbox(key="trace").value == "demo-1/1-before"
    assert at.sidebar.radio(key="section").value == "Compare"
    assert at.selectbox(key="compare_with").value == "demo-1/2-after"
    assert any("Compare two runs" in m.value for m in at.markdown)


def test_a_link_naming_what_is_not_offered_opens_the_default_page(tmp_path: Path) -> None:
    folder = tmp_path / "demo-1"
    record_gpipe_run(folder / "1-before", p=2, m=2)
    at = _app(folder, section="Secrets", trace="/etc/passwd")
    assert not at.exception, at.exception
    assert at.sidebar.radio(key="section").value == "Timeline"
    assert at.sidebar.selectbox(key="trace").value == "demo-1/1-before"
