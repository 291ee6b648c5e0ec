"""A real Prometheus server scrapes `ppscope run --prometheus-port` once a second, and a query of its HTTP API
returns the stage metrics of the running engine. Everything listens on 127.0.0.1 and is stopped at the end."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from test_live_metrics import grafana_queries

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS = shutil.which("prometheus")
STAGES = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _query(port: int, expr: str) -> list[dict[str, Any]]:
    """The instant vector of `expr` from Prometheus' HTTP API; empty while it cannot answer yet."""
    url = f"http://127.0.0.1:{port}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = json.load(resp)
    except OSError:
        return []
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _stop(proc: subprocess.Popen[bytes], sig: int, grace_s: float) -> None:
    """Signal the process group, then kill it if it has not exited within `grace_s`."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.mark.skipif(
    PROMETHEUS is None,
    reason="needs the Prometheus server: apt-get install prometheus (Debian's package; .ci/run installs it)",
)
def test_prometheus_scrapes_the_stage_metrics_of_a_running_engine(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the engine needs torch")
    pytest.importorskip("prometheus_client", reason="needs prometheus_client: pip install 'ppscope[metrics]'")
    assert PROMETHEUS is not None
    metrics_port, web_port = _free_port(), _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: ppscope\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{metrics_port}']\n"
    )
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed below, after the server
    server = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{web_port}",
        ],
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ppscope",
            "run",
            "--stages",
            str(STAGES),
            "--model",
            "synthetic",
            "--layers",
            "4",
            "--layer-cost-ms",
            "2",
            "--requests",
            "200",
            "--max-new-tokens",
            "20",
            "--schedule",
            "serve",
            "--no-progress",
            "--out",
            str(tmp_path / "run"),
            "--prometheus-port",
            str(metrics_port),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    busy: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and run.poll() is None and server.poll() is None:
            busy = _query(web_port, "ppscope_stage_busy_ratio")
            if len(busy) == STAGES:
                break
            time.sleep(0.5)
        bubble = _query(web_port, "ppscope_stage_bubble_ratio")
        bottleneck = _query(web_port, "ppscope_bottleneck_stage")
        running = _query(web_port, 'ppscope_run_status{status="running"}')
        up = _query(web_port, 'up{job="ppscope"}')
        board: dict[str, list[dict[str, Any]]] = {}
        while time.monotonic() < deadline and run.poll() is None:  # rates need two scrapes: wait for them
            board = {expr: _query(web_port, _concrete(expr)) for expr in grafana_queries()}
            if all(board.values()):
                break
            time.sleep(0.5)
    finally:
        _stop(run, signal.SIGINT, 30)  # a run still going is interrupted, and says so in its meta.json
        _stop(server, signal.SIGTERM, 30)
        log.close()
        _, run_err = run.communicate()
    why = f"run: {run_err.decode()[-2000:]}\nprometheus: {(tmp_path / 'prometheus.log').read_text()[-2000:]}"
    assert len(busy) == STAGES, why
    assert sorted(s["metric"]["stage"] for s in busy) == [str(s) for s in range(STAGES)]
    for series in busy:
        assert series["metric"]["job"] == "ppscope" and series["metric"]["instance"] == f"127.0.0.1:{metrics_port}"
        assert 0.0 < float(series["value"][1]) <= 1.0
    assert len(bubble) == STAGES
    assert [float(s["value"][1]) for s in up] == [1.0]
    assert [float(s["value"][1]) for s in running] == [1.0]  # it was scraped while the engine ran
    assert bottleneck and 0 <= float(bottleneck[0]["value"][1]) < STAGES
    # every query of the shipped Grafana dashboard is valid PromQL (`_query` asserts it), and its panels get data
    assert board and not [expr for expr, result in board.items() if not result], board


def _concrete(expr: str) -> str:
    """A Grafana query as Prometheus takes it: the dashboard's variables replaced."""
    if expr.startswith("label_values("):  # a variable's values: the series of its metric
        return expr.removeprefix("label_values(").split(",")[0]
    return expr.replace("$__rate_interval", "5s").replace("$instance", ".*")
