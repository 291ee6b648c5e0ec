"""The text report, the JSON keys and the self-contained HTML report, through the CLI on a stored run."""

from __future__ import annotations

import base64
import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest
from error_helpers import cli_error

from ppscope.analysis import CAUSES, analyze
from ppscope.analysis.report import html_report, render_text
from ppscope.cli.main import main
from ppscope.errors import ErrorCode
from ppscope.trace.model import SPAN_COLUMNS, RankInfo, RunMeta, Trace
from ppscope.trace.store import REQUESTS_FILE, RankWriter, create_run

P, M, T = 3, 4, 1_000_000  # stages, micro-batches, ns per forward

TOP_KEYS = {
    "bubble_ratio",
    "imbalance",
    "bottleneck_stage",
    "balance_speedup",
    "theory",
    "throughput_tokens_per_s",
    "window_ns",
    "stages",
}
STAGE_KEYS = {"stage", "busy_ns", "bubble_ns", "bubble_ratio", "time_per_mb_ns", "causes"}


def _row(rank: int, kind: str, mb: int, start: int, end: int, **kw: object) -> tuple[object, ...]:
    row = dict(
        rank=rank,
        stage=rank,
        lane="compute",
        kind=kind,
        name=f"s{rank} {kind} mb{mb}",
        mb=mb,
        step=-1,
        chunk=0,
        phase="",
        start_ns=start,
        end_ns=end,
        nbytes=0,
        tokens=0,
        peer=-1,
    )
    row.update(kw)
    return tuple(row[c] for c in SPAN_COLUMNS)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    meta = RunMeta(
        run_id="t",
        world_size=P,
        pp_size=P,
        schedule="gpipe",
        microbatches=M,
        status="finished",
        ranks=[RankInfo(rank=r, stage=r) for r in range(P)],
    )
    path = create_run(tmp_path / "run", meta)
    for r in range(P):
        w = RankWriter(path, r)
        rows = [_row(r, "forward", m, (r + m) * T, (r + m + 1) * T, tokens=8) for m in range(M)]
        if r > 0:
            rows += [_row(r, "recv_wait", 0, 0, r * T, lane="recv", peer=r - 1, nbytes=4096)]
        if r == P - 1:
            rows += [_row(r, "sample", m, (r + m + 1) * T, (r + m + 1) * T, tokens=8) for m in range(M)]
        w.write(rows)
        w.close()
    lines = [
        json.dumps(
            dict(id=i, prompt_len=4, output_len=5, arrival_ns=0, first_token_ns=(i + 3) * T, finish_ns=(i + 7) * T)
        )
        for i in range(4)
    ]
    (path / REQUESTS_FILE).write_text("\n".join(lines) + "\n")
    return path


def test_json_keys_and_values(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(run_dir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= TOP_KEYS
    assert set(out["theory"]) >= {"formula", "bubble_ratio"}
    assert out["theory"]["formula"] == "GPipe (P-1)/(M+P-1)"
    assert out["window_ns"] == (M + P - 1) * T
    assert out["bubble_ratio"] == pytest.approx((P - 1) / (M + P - 1))
    assert [s["stage"] for s in out["stages"]] == list(range(P))
    for s in out["stages"]:
        assert set(s) >= STAGE_KEYS and set(s["causes"]) == set(CAUSES)
        assert sum(s["causes"].values()) == s["bubble_ns"]
    assert out["latency"]["ttft_ms"]["p50_ms"] == pytest.approx(4.5)
    assert out["throughput_tokens_per_s"] == pytest.approx(20 / (10 * T / 1e9))


def test_text_report(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(run_dir), "--steady"]) == 0
    text = capsys.readouterr().out
    assert "Σ bubble / (P × window)" in text
    assert "GPipe (P-1)/(M+P-1)" in text
    assert "steady state" in text
    assert "TTFT" in text


def _packed_plotly(page: str) -> str:
    found = re.search(r"<script type='application/octet-stream' id='plotly-js-gz'>([^<]*)</script>", page)
    assert found, "plotly.js is in the page"
    return found.group(1)


def _figure_specs(page: str) -> list[dict[str, Any]]:
    return [
        json.loads(m) for m in re.findall(r"<script type='application/json' id='figure-\d+-spec'>(.*?)</script>", page)
    ]


def test_html_is_self_contained(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import plotly.offline

    out = tmp_path / "report.html"
    assert main(["analyze", str(run_dir), "--html", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"<script[^>]+src=", page), "an external script would need a network"
    # plotly.js once, whole: the installed plotly's own, gzipped
    assert page.count("id='plotly-js-gz'") == 1
    assert gzip.decompress(base64.b64decode(_packed_plotly(page))).decode() == plotly.offline.get_plotlyjs()
    specs = _figure_specs(page)  # gantt, stage breakdown, theory vs measured
    assert len(specs) == 3 and page.count("class='ppscope-figure'") == 3
    assert specs[0]["layout"]["xaxis"]["title"]["text"] == "time since run start (ms)"  # as every table
    assert main(["analyze", str(run_dir), "--html", str(tmp_path / "again.html")]) == 0
    assert (tmp_path / "again.html").read_bytes() == out.read_bytes()  # the same report is the same bytes


REPORT_BYTES = 2_200_000
"""A small run's HTML report at most: plotly.js gzipped is 1.47 MB of its 4.8 MB (1.96 MB in base64), the floor
for a report that draws offline; the run's own part is 38 kB. It was 4.9 MB, plotly.js inlined as it is."""
RUN_PART_BYTES = 100_000
"""The report less plotly.js, for that run: 38 kB measured (tables, 3 figures of 13 rows' spans); a report that
grows with the run's spans more than 2.5 times faster than now fails here first."""


def test_the_html_report_of_a_small_simulated_run_is_small(tmp_path: Path) -> None:
    run, out = tmp_path / "sim", tmp_path / "report.html"
    sizes = ["--stages", "4", "--microbatches", "8", "--layers", "16", "--layer-cost-ms", "1"]
    assert main(["simulate", "--out", str(run), *sizes]) == 0
    assert main(["analyze", str(run), "--html", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert len(page.encode()) < REPORT_BYTES
    assert len(page) - len(_packed_plotly(page)) < RUN_PART_BYTES


def test_cli_errors_are_one_line(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    failed = cli_error(capsys, ["analyze", str(run_dir), "--window", "500:600"])
    assert failed.exit_code == 2 and failed.code == ErrorCode.WINDOW_OUTSIDE_TRACE
    assert "Traceback" not in failed.err and failed.err.count("\n") == 1
    assert cli_error(capsys, ["analyze", str(run_dir), "--window", "abc"])[:2] == (2, ErrorCode.BAD_WINDOW)
    assert cli_error(capsys, ["analyze", str(tmp_path / "nope")])[:2] == (2, ErrorCode.RUN_NOT_FOUND)
    failed = cli_error(capsys, ["analyze", str(run_dir), "--html", str(tmp_path / "no" / "dir" / "r.html")])
    assert failed.exit_code == 2 and failed.code == ErrorCode.OUTPUT_NOT_WRITABLE


def test_an_empty_run_is_an_error_that_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    create_run(tmp_path / "empty", RunMeta(world_size=1))
    failed = cli_error(capsys, ["analyze", str(tmp_path / "empty")])
    assert failed.exit_code == 2 and failed.code == ErrorCode.NO_SPANS  # no report, the error's code
    assert failed.err.count("\n") == 1 and str(tmp_path / "empty") in failed.text and "rank 0" in failed.text


def test_a_run_stopped_before_any_request_finished_reports_none_of_those_asked(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (run_dir / REQUESTS_FILE).write_text("")  # rank 0 logs a request as it finishes: none had
    meta = json.loads((run_dir / "meta.json").read_text())
    meta.update(source="ppscope", status="interrupted", config={"requests": 400})  # an engine run
    (run_dir / "meta.json").write_text(json.dumps(meta))
    assert main(["analyze", str(run_dir), "--json"]) == 0
    lat = json.loads(capsys.readouterr().out)["latency"]
    assert (lat["requests"], lat["finished"], lat["output_tokens"], lat["ttft_ms"]) == (400, 0, 0, None)
    assert main(["analyze", str(run_dir)]) == 0
    assert "Requests: 0/400 finished" in capsys.readouterr().out


def test_render_text_and_html_without_trace() -> None:
    res = analyze(Trace())
    assert "no spans" in render_text(res)
    assert "<html>" in html_report(res) or "<html" in html_report(res)


def _chromium() -> str | None:
    import shutil

    for name in ("/usr/bin/chromium", "chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.mark.browser
@pytest.mark.slow
def test_html_report_draws_offline_in_chromium(run_dir: Path, tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    executable = _chromium()
    if executable is None:
        pytest.skip("no Chromium found (/usr/bin/chromium, chromium, chromium-browser): apt-get install chromium")
    out = tmp_path / "report.html"
    assert main(["analyze", str(run_dir), "--html", str(out), "--json"]) == 0
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable)
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: None if r.url.startswith(("file:", "data:")) else errors.append(r.url))
        page.goto(out.as_uri())
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 3", timeout=30_000)
        plots = page.locator(".js-plotly-plot").count()
        bars = page.locator(".js-plotly-plot .barlayer .point").count()
        boxes = page.evaluate(_BOXES_JS)
        browser.close()
    assert errors == [], "the report must open without a server or network"
    assert plots == 3 and bars > 0
    for n, box in enumerate(boxes):  # each legend beside or under its plot and clear of its title
        assert box["legend"] and not _overlap(box["legend"], box["plot"]), (n, box)
        assert not box["title"] or not _overlap(box["legend"], box["title"]), (n, box)


# Per plot: the rectangles (left, top, right, bottom) of its legend, its plot area and its title.
_BOXES_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => {
  const box = sel => { const e = gd.querySelector(sel); if (!e) return null;
    const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  return {legend: box('g.legend'), plot: box('.nsewdrag'), title: box('.gtitle')};
})"""


def _overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
