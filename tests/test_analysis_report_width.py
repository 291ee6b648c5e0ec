"""Reports fit the terminal: tables drop columns rather than break numbers, piped sentences never wrap."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from ppscope.analysis import analyze
from ppscope.analysis.report import print_report, summary_lines
from ppscope.balance.costs import LayerCosts
from ppscope.formats.sources import open_trace
from ppscope.simulate.simulator import CommModel, SimConfig, simulate, write_run


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # host time and hop latency give the stage table more causes than 80 columns hold beside fill and drain
    cfg = SimConfig(
        schedule="gpipe",
        stages=4,
        microbatches=8,
        steps=2,
        costs=LayerCosts.uniform(8, 1.0),
        overhead_ms=0.05,
        comm=CommModel(latency_us=20),
    )
    return write_run(simulate(cfg), tmp_path_factory.mktemp("w") / "sim")


def _terminal(width: int) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=width, force_terminal=True, color_system=None), buf


def test_at_80_columns_every_line_fits_and_every_figure_is_whole(run: Path) -> None:
    result = analyze(open_trace(run))
    console, buf = _terminal(80)
    print_report(result, console)
    lines = buf.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    table = [line for line in lines if line.startswith("│")]
    assert table and all(line.count("│") == table[0].count("│") for line in table[:4])  # one row per stage
    for s in result.stages:  # the busy time of each stage is printed whole on its row
        assert any(f"{s.busy_ns / 1e6:,.3f}" in line for line in table)
    assert any(line.startswith("left out to fit 80 columns: ") for line in lines)
    assert not any(line.strip() in ("stag", "e") for line in lines)


def test_a_wide_terminal_keeps_every_column(run: Path) -> None:
    console, buf = _terminal(200)
    print_report(analyze(open_trace(run)), console)
    assert "left out to fit" not in buf.getvalue() and "fill" in buf.getvalue()


def test_piped_output_does_not_wrap_sentences(run: Path) -> None:
    code = "from ppscope.cli.main import main; import sys; sys.exit(main(sys.argv[1:]))"
    env = {k: v for k, v in __import__("os").environ.items() if k != "COLUMNS"}
    out = subprocess.run([sys.executable, "-c", code, "analyze", str(run)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    for line in summary_lines(analyze(open_trace(run))):
        assert line in out.stdout.splitlines()
