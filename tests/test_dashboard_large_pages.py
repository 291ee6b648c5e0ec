"""A large run's Rebalance, GPU usage and Requests pages: the figures of the whole load, read a rank at a time."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

pytest.importorskip("streamlit")
from replica_helpers import replica_job
from test_dashboard_app import _app, _chart_specs
from test_dashboard_large import LARGE

from ppscope.simulate.simulator import write_run
from ppscope.trace import store
from ppscope.trace.model import Metric, Trace, requests_frame, spans_frame

P, REPLICAS = 3, 8
SAMPLE_NS = 2_000


def _job() -> Trace:
    """3 stages × 8 replicas: stage 1 slow everywhere (the advice moves a layer off it), slowest in replica 6;
    the last stage samples a token per micro-batch; 20 requests in the log."""
    trace = replica_job(P, REPLICAS, layers=4 * P, slow={(1, r): 2.0 if r == 6 else 1.6 for r in range(REPLICAS)})
    spans = trace.spans.copy()
    last = (spans["kind"] == "forward") & (spans["stage"] == P - 1)
    sample = spans[last].copy()
    spans.loc[last, "end_ns"] -= SAMPLE_NS  # the forward's last 2 µs become its sampling: no overlap
    sample["kind"], sample["start_ns"], sample["tokens"] = "sample", sample["end_ns"] - SAMPLE_NS, 1
    requests = requests_frame(
        pd.DataFrame(
            {
                "id": range(20),
                "prompt_len": 8,
                "output_len": [4 + i % 5 for i in range(20)],
                "arrival_ns": [i * 30_000 for i in range(20)],
                "first_token_ns": [i * 30_000 + 400_000 + 7_000 * i for i in range(20)],
                "finish_ns": [i * 30_000 + 900_000 + 11_000 * i for i in range(20)],
            }
        )
    )
    spans = spans_frame(pd.concat([spans, sample], ignore_index=True))
    return Trace(spans=spans, meta=trace.meta, requests=requests).sorted()


def _with_counters(run: Path) -> Path:
    """GPU samples in each rank file (utilisation and memory, different per rank), as the engine writes them."""
    for rank in range(P * REPLICAS):
        rows = [
            (t * 100_000, rank, rank % 4, str(metric), value)
            for t in range(12)
            for metric, value in (
                (Metric.GPU_UTIL_PCT, 40.0 + (rank * 7 + t * 3) % 50),
                (Metric.GPU_MEM_USED_BYTES, float((rank + 1) * 2**28 + t * 2**20)),
            )
        ]
        db = sqlite3.connect(store.rank_file(run, rank))
        with db:
            db.executemany("INSERT INTO counters (ts_ns, rank, device, metric, value) VALUES (?, ?, ?, ?, ?)", rows)
        db.close()
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    trace = _job()
    tmp = tmp_path_factory.mktemp("pages")
    return _with_counters(write_run(trace, tmp / "whole")), _with_counters(write_run(trace, tmp / "large"))


def _shown(at: Any) -> dict[str, Any]:
    return {
        "charts": _chart_specs(at),
        "tables": [d.value.to_dict("list") for d in at.dataframe],
        "metrics": [(m.label, m.value) for m in at.metric],
        "markdown": [m.value for m in at.markdown],
        "errors": [e.value for e in at.error],
        "success": [s.value for s in at.success],
    }


def _section(
    run: Path, section: str, *args: str, rank: int | None = None, reads: list[list[int]] | None = None
) -> dict[str, Any]:
    """What `section` shows, opened from the Timeline (`reads`: emptied once the Timeline is drawn)."""
    at = _app(*args, run).run()  # type: ignore[arg-type]
    if reads is not None:
        reads.clear()
    at.sidebar.radio(key="section").set_value(section).run()
    if rank is not None:
        at.selectbox(key="usage_rank").set_value(rank).run()
    assert not at.exception, at.exception
    return {**_shown(at), "info": [i.value for i in at.info], "captions": [c.value for c in at.caption]}


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The ranks of each read of spans (`store.read_ranks`)."""
    reads: list[list[int]] = []
    read_ranks = store.read_ranks

    def counting(files: dict[int, Path], *args: Any) -> Any:
        reads.append(sorted(files))
        return read_ranks(files, *args)

    monkeypatch.setattr(store, "read_ranks", counting)
    return reads


def test_the_rebalance_page_gives_the_advice_of_the_whole_load_and_of_the_command(
    runs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ppscope.cli.main import main

    whole, large = runs
    expected = _section(whole, "Rebalance")
    reads = _counting(monkeypatch)
    got = _section(large, "Rebalance", LARGE, reads=reads)
    assert sorted(reads) == [[r] for r in range(24)]  # every rank file read alone, once: its timed parts
    # the page of the whole load leads with the schedule replay; a rank at a time there is none (it needs every
    # span): the slowest stage's ratio leads, the rest is the same
    replayed = dict(expected["metrics"]).pop("Predicted speedup")
    assert [m for m in got["metrics"] if m[0] != "Predicted speedup"] == [
        m for m in expected["metrics"] if m[0] != "Predicted speedup"
    ]
    assert got["charts"][0] == expected["charts"][0]  # each stage's predicted time, now and advised
    assert got["captions"][0] == expected["captions"][0]
    cost_source = next(c for c in expected["captions"] if "Costs fitted" in c)
    assert cost_source in got["captions"]
    assert any("Costs read a rank at a time from 24 rank files" in i for i in got["info"])
    assert len(got["charts"]) == 1 and len(expected["charts"]) == 3  # the timelines need the whole run
    assert main(["rebalance", str(large), "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    values = dict(got["metrics"])
    assert cli["advice"] == "change" and got["success"][0].startswith("Advice: change the split.")
    assert values["Current split"] == ",".join(map(str, cli["current_split"])) == "4,4,4"
    assert values["Proposed split"] == ",".join(map(str, cli["proposed_split"]))
    assert replayed == f"×{cli['predicted_speedup']:.3f}" and cli["simulated"] is not None
    assert values["Predicted speedup"] == f"×{cli['slowest_stage_speedup']:.3f}"
    assert values["Slowest stage"] == f"{cli['max_stage_ms']['proposed']:.3f} ms"


def test_the_usage_page_sums_up_each_stage_and_replica_as_the_whole_load_does(
    runs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    whole, large = runs
    reads = _counting(monkeypatch)
    got = [_section(large, "GPU usage", LARGE, reads=reads), _section(large, "GPU usage", LARGE, rank=14, reads=reads)]
    assert reads == []  # no spans: the counters alone, a rank file at a time
    expected = [_section(whole, "GPU usage"), _section(whole, "GPU usage", rank=14)]
    for g, e in zip(got, expected, strict=True):
        assert {k: g[k] for k in ("charts", "tables", "markdown", "success")} == {
            k: e[k] for k in ("charts", "tables", "markdown", "success")
        }
    by_stage, by_replica = got[0]["tables"]
    assert by_stage["stage"] == [0, 1, 2] and by_stage["ranks"] == [8, 8, 8]
    assert by_replica["replica"] == list(range(8)) and by_replica["ranks"] == [3] * 8
    # stage 2's devices: ranks 16-23, each holding (rank + 1) / 4 GiB plus up to 11 MiB
    assert by_stage["memory used (GiB): peak"][2] == round((24 * 2**28 + 11 * 2**20) / 2**30, 3)
    lines = {t["name"] for t in got[1]["charts"][0]["data"]}
    assert lines == {"rank 14 · gpu 2"}  # the rank picked, alone: not a line per device of the job
    assert got[1]["success"] == ["Rank 14: GPU usage per device (NVML counters)"]
    assert any("Read a rank at a time: the counters of 24 rank files" in c for c in got[0]["captions"])


def test_the_requests_page_reads_the_request_log_alone(
    runs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    whole, large = runs
    expected = _section(whole, "Requests")
    at = _app(Path(LARGE), large).run()
    reads = _counting(monkeypatch)
    at.sidebar.radio(key="section").set_value("Requests").run()
    assert not at.exception, at.exception
    assert reads == []  # the replicas' analysis is the Timeline's, read before: only requests.jsonl now
    got = _shown(at)
    assert got == {k: expected[k] for k in got}
    assert dict(got["metrics"])["Requests"] == "20"
    replicas = got["tables"][1]
    assert replicas["replica"] == list(range(8))
    assert all(tp is not None and tp > 0 for tp in replicas["output tokens/s"])
    assert set(replicas["counted from"]) == {"tokens of `sample` spans ending in the window / window"}


def test_a_large_run_being_written_is_read_again_a_rank_at_a_time(tmp_path: Path) -> None:
    import time

    from ppscope.dashboard.ranked import READ_SHARE, RankedRun
    from ppscope.trace.model import SPAN_COLUMNS

    run = write_run(replica_job(P, REPLICAS), tmp_path / "job")
    meta = json.loads((run / "meta.json").read_text())
    (run / "meta.json").write_text(json.dumps({**meta, "status": "running"}))
    big = RankedRun.open(run, limit=4)
    assert big is not None and big.live
    before = big.replicas().last_ns
    assert not big.refresh()  # no rank wrote: what was read stands
    cols = ", ".join(SPAN_COLUMNS)
    db = sqlite3.connect(store.rank_file(run, 14))
    row = list(db.execute(f"SELECT {cols} FROM spans WHERE kind = 'forward' ORDER BY end_ns DESC LIMIT 1").fetchone())
    start, end = list(SPAN_COLUMNS).index("start_ns"), list(SPAN_COLUMNS).index("end_ns")
    row[start], row[end] = row[start] + 5_000_000, row[end] + 5_000_000  # rank 14 goes on: one more forward
    with db:
        db.execute(f"INSERT INTO spans ({cols}) VALUES ({', '.join('?' * len(row))})", row)
    db.close()
    assert big.replicas().last_ns == before  # not read again by itself
    assert not big.refresh(now=0.0)  # too soon after the last read (READ_SHARE times its time)
    assert big.refresh(now=time.monotonic() + READ_SHARE * big.read_s)
    assert big.replicas().last_ns == row[end] > before  # read again: the new forward is the run's last span
    assert not big.refresh(now=time.monotonic() + READ_SHARE * big.read_s)  # nothing more written
    (run / "meta.json").write_text(json.dumps({**meta, "status": "finished"}))
    assert big.refresh(now=time.monotonic() + READ_SHARE * big.read_s)  # it ended: the page opens it anew
    done = RankedRun.open(run, limit=4)
    assert done is not None and not done.live and not done.refresh()
    (run / "meta.json").write_text(json.dumps({**meta, "status": "running"}))
    at = _app(Path(LARGE), run).run()
    assert not at.exception, at.exception
    assert any("Live: this run is still being written" in c.value for c in at.caption)
    assert any("Read a rank at a time" in c.value for c in at.caption)


@pytest.mark.browser
@pytest.mark.slow
def test_chromium_shows_the_pages_of_a_large_run(tmp_path: Path) -> None:
    from test_dashboard_browser import dashboard_page

    run = _with_counters(write_run(_job(), tmp_path / "job"))  # 24 rank files, shown a rank at a time
    seen = {}
    with dashboard_page(run, ranks_in_memory=8) as page:
        for section, ready in (
            ("Rebalance", "Proposed split"),
            ("GPU usage", "Per replica"),
            ("Requests", "each replica's output tokens/s"),
        ):
            page.get_by_text(section, exact=True).click()
            page.get_by_text(ready).first.wait_for(timeout=60_000)
            page.wait_for_selector(".js-plotly-plot", timeout=60_000)
            page.screenshot(path=str(tmp_path / f"{section}.png"), full_page=True)
            seen[section] = page.inner_text("body")
    assert "4,3,5" in seen["Rebalance"] and "Costs read a rank at a time from 24 rank files" in seen["Rebalance"]
    assert "Load the whole run" not in seen["GPU usage"].split("Device usage")[1]
    assert "Read a rank at a time: the counters of 24 rank files" in seen["GPU usage"]
    assert "TTFT p50" in seen["Requests"]
    assert not any("Timeline lanes of a job" in text for text in seen.values())  # no module string on the page


def test_sessions_asking_at_once_read_a_large_run_once(tmp_path: Path) -> None:
    """Two sessions opening the Rebalance page of a 1,000-rank job at once must not read it twice; a read that
    began before the run changed is shown to its caller but not kept for the next."""
    import threading
    import time

    from ppscope.dashboard.ranked import READ_SHARE, RankedRun

    run = write_run(replica_job(P, REPLICAS), tmp_path / "job")
    big = RankedRun.open(run, limit=4)
    assert big is not None
    calls: list[int] = []

    def slow() -> int:
        calls.append(1)
        time.sleep(0.2)
        return len(calls)

    got: list[int] = []
    threads = [threading.Thread(target=lambda: got.append(big.memo("x", slow))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [1, 1, 1] and len(calls) == 1
    meta = json.loads((run / "meta.json").read_text())
    (run / "meta.json").write_text(json.dumps({**meta, "status": "running"}))
    live = RankedRun.open(run, limit=4)
    assert live is not None and live.live
    live.replicas()

    def changed_meanwhile() -> str:
        (run / "meta.json").write_text(json.dumps({**meta, "status": "finished"}))
        assert live.refresh(now=time.monotonic() + READ_SHARE * live.read_s)
        return "read before the change"

    assert live.memo("y", changed_meanwhile) == "read before the change"
    assert live.memo("y", lambda: "read after") == "read after"
