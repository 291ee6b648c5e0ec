"""`ppscope watch` and the Prometheus endpoint: the text it serves parses with prometheus_client's own parser and
holds the analyzer's values for a simulated run; it stops when the run has ended or on Ctrl-C; bad input is one
line."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from error_helpers import cli_error, raises_code

from ppscope.analysis import CAUSES, AnalysisConfig, analyze
from ppscope.cli.main import main
from ppscope.errors import ErrorCode, PPScopeError
from ppscope.live.metrics import SPECS, HistogramValue, Snapshot
from ppscope.trace.store import load_run

parser = pytest.importorskip(
    "prometheus_client.parser", reason="needs prometheus_client: pip install 'ppscope[metrics]'"
)
from ppscope.cli.exporter import Exporter, load_client  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WINDOW_S = 0.25


def _scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """name -> {sorted labels: value} of every sample served at `url`, as Prometheus' parser reads them."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def _ppscope(*args: str, **kw: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-m", "ppscope", *args],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        **kw,
    )  # type: ignore[call-overload]


def _url_of(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "serving the metrics of" in line, line + (proc.stderr.read() if proc.stderr else "")
    return line.split(" at ", 1)[1].split()[0]


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sim") / "run"
    code = main(
        [
            "simulate",
            "--schedule",
            "serve",
            "--stages",
            "3",
            "--microbatches",
            "2",
            "--steps",
            "60",
            "--layers",
            "6",
            "--layer-cost-ms",
            "1",
            "--head-cost-ms",
            "2",
            "--comm-latency-us",
            "80",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    return out


def test_watch_serves_the_analyzers_values_then_stops_on_ctrl_c(simulated: Path) -> None:
    proc = _ppscope("watch", str(simulated), "--prometheus-port", "0", "--window", str(WINDOW_S), "--linger", "60")
    try:
        url = _url_of(proc)
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        deadline = time.monotonic() + 60
        got = _scrape(url)
        while "ppscope_stage_busy_ratio" not in got and time.monotonic() < deadline:
            time.sleep(0.2)
            got = _scrape(url)
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err  # interrupted, as every command
    assert "the run has ended (finished); serving its last values for 60 s" in out
    assert err.strip() == "ppscope watch: stopped", err

    trace = load_run(simulated)
    end, first = int(trace.spans["end_ns"].max()), int(trace.spans["start_ns"].min())
    window = ((end - WINDOW_S * 1e9 - first) / 1e6, (end - first) / 1e6)
    expect = analyze(trace, AnalysisConfig(window_ms=window))
    assert got["ppscope_window_seconds"][()] == pytest.approx(WINDOW_S)
    assert got["ppscope_bubble_ratio"][()] == pytest.approx(expect.bubble_ratio)
    for stage in expect.stages:
        s = (("stage", str(stage.stage)),)
        assert got["ppscope_stage_bubble_ratio"][s] == pytest.approx(stage.bubble_ratio)
        assert got["ppscope_stage_busy_ratio"][s] == pytest.approx(stage.busy_ns / expect.window.length_ns)
        for cause in CAUSES:
            key = (("cause", cause), *s)
            assert got["ppscope_stage_window_idle_seconds"][key] == pytest.approx(stage.causes[cause] / 1e9)
            assert got["ppscope_stage_idle_seconds_total"][key] == pytest.approx(stage.causes[cause] / 1e9)
    assert got["ppscope_bottleneck_stage"][()] == expect.bottleneck_stage
    assert got["ppscope_balance_speedup"][()] == pytest.approx(expect.balance_speedup)
    assert got["ppscope_run_status"][(("status", "finished"),)] == 1.0
    assert got["ppscope_read_errors_total"][()] == 0.0  # there from the start
    assert got["ppscope_run_info"][(("run_id", "run"), ("schedule", "serve"), ("source", "simulator"))] == 1.0
    finished = trace.requests["finish_ns"].to_numpy()
    tokens = trace.requests["output_len"].to_numpy()[finished > end - WINDOW_S * 1e9].sum()
    assert got["ppscope_tokens_per_second"][()] == pytest.approx(tokens / WINDOW_S)
    links = {dict(k)["src"] for k in got["ppscope_hop_latency_seconds_count"]}
    assert links and got["ppscope_hop_latency_seconds_bucket"]


def test_watch_stops_by_itself_once_the_run_has_ended(simulated: Path) -> None:
    proc = _ppscope("watch", str(simulated), "--prometheus-port", "0", "--window", "1")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.splitlines()[1:] == ["ppscope watch: the run has ended (finished)", "ppscope watch: stopped"]


def test_the_endpoint_serves_every_kind_and_nothing_unknown() -> None:
    exporter = Exporter("127.0.0.1", 0)
    try:
        assert _scrape(exporter.url) == {}  # nothing published yet: no sample, rather than a false 0
        hist = HistogramValue(bounds=(0.001, 0.01), counts=(2, 1, 1), sum=0.5)
        exporter.publish(
            Snapshot(
                values={"ppscope_stage_busy_ratio": {("0",): 0.75}, "ppscope_tokens_total": {(): 12.0}},
                histograms={"ppscope_hop_latency_seconds": {("0", "1"): hist}},
            )
        )
        got = _scrape(exporter.url)
    finally:
        exporter.close()
    assert got["ppscope_stage_busy_ratio"] == {(("stage", "0"),): 0.75}
    assert got["ppscope_tokens_total"] == {(): 12.0}
    link = (("dst", "1"), ("src", "0"))
    buckets = {dict(k)["le"]: v for k, v in got["ppscope_hop_latency_seconds_bucket"].items()}
    assert buckets == {"0.001": 2.0, "0.01": 3.0, "+Inf": 4.0}
    assert got["ppscope_hop_latency_seconds_count"][link] == 4.0 and got["ppscope_hop_latency_seconds_sum"][link] == 0.5
    assert {s.name for s in SPECS} >= {"ppscope_stage_busy_ratio", "ppscope_hop_latency_seconds"}


def _one_line_error(proc: subprocess.Popen[str], starts: str) -> str:
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(starts), err
    return lines[0]


def test_bad_input_is_one_line(tmp_path: Path, simulated: Path) -> None:
    line = _one_line_error(_ppscope("watch", str(tmp_path / "nope"), "--prometheus-port", "0"), "ppscope watch: error:")
    assert "does not exist" in line
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.txt").write_text("x")
    line = _one_line_error(_ppscope("watch", str(tmp_path / "folder"), "--prometheus-port", "0"), "ppscope watch:")
    assert "not a ppscope run" in line
    line = _one_line_error(_ppscope("watch", str(simulated), "--prometheus-port", "0", "--window", "0"), "ppscope")
    assert "--window must be a positive number of seconds" in line
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        line = _one_line_error(_ppscope("watch", str(simulated), "--prometheus-port", port), "ppscope watch: error:")
    assert f"cannot serve metrics on 127.0.0.1:{port}" in line


def test_without_prometheus_client_the_error_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    load_client()
    for name in ("prometheus_client", "prometheus_client.core", "prometheus_client.utils"):
        monkeypatch.setitem(sys.modules, name, None)
    with raises_code(PPScopeError, ErrorCode.NOT_INSTALLED):
        load_client()


def test_run_refuses_to_serve_under_torchrun(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("torch", reason="the engine needs torch")
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(key, value)
    failed = cli_error(capsys, ["run", "--prometheus-port", "0", "--out", str(tmp_path / "run")])
    assert failed.exit_code == 2 and failed.code == ErrorCode.CONFLICTING_OPTIONS, failed
    assert failed.err.count("\n") == 1 and "ppscope watch" in failed.text  # the command that serves it instead
    assert not (tmp_path / "run").exists()
