"""The bare rings the engine benchmark measures itself against: they run, and what they return is an
efficiency (measured ÷ ideal) of a pipeline that only sleeps and passes messages."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from benchmarks.ring_reference import gpipe_efficiency, ring_efficiency

FLOOR = 0.1
"""Efficiency below which a ring is taken to have stalled rather than run slowly (tests assert no speed)."""


@pytest.mark.parametrize("transport", ["pipe", "gloo"])
def test_a_bare_ring_reaches_most_of_its_ideal(transport: str) -> None:
    eff = ring_efficiency(transport, stages=2, stage_ms=2.0, passes=60)
    # a hold skipped would show above 1, a message lost would hang and fail; below, a loaded machine can
    # stretch the hops of 2 ms holds a long way (0.26-0.37 seen with busy neighbours), so that bound is loose
    assert FLOOR < eff < 1.05


def test_a_bare_gpipe_pipeline_reaches_most_of_its_ideal() -> None:
    assert FLOOR < gpipe_efficiency(stages=2, microbatches=3, steps=3, stage_ms=2.0) < 1.05


def test_an_unknown_transport_is_named() -> None:
    with pytest.raises(ValueError, match=r"'shm'.*gloo, pipe"):  # the name, and the valid ones
        ring_efficiency("shm")


@pytest.mark.slow
def test_the_rings_start_under_a_main_that_cannot_run_twice(tmp_path: Path) -> None:
    # the benchmark harness's __main__ may be anything (an app-test script once the dashboard benchmark ran):
    # the ranks must not re-run it
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from benchmarks.ring_reference import gpipe_efficiency\n"
        "print(gpipe_efficiency(stages=2, microbatches=2, steps=2, stage_ms=1.0))\n"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert FLOOR < float(done.stdout.strip().splitlines()[-1]) < 1.05


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal on machines without CUDA")
def test_the_gpu_check_refuses_in_one_line_without_cuda(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.gpu_check import main

    assert main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA device" in err[0]
    assert not (tmp_path / "gpu_check.md").exists()


@pytest.mark.slow
def test_the_ring_check_a_multi_gpu_machine_runs_works_over_gloo(tmp_path: Path) -> None:
    """The multi-GPU section of the GPU check, run over gloo: every schedule's tokens against one rank's, and
    the efficiency, span and clock findings, one line each."""
    from benchmarks.ring_check import SCHEDULES, ring_checks

    lines = ring_checks(tmp_path, "gloo", 2, stage_ms=1.0, tokens=2)
    assert lines[0] == "ring of 2 ranks over gloo:"
    for name in SCHEDULES:
        assert f"  tokens, {name}: equal to one rank's (4 requests, 8 tokens)" in lines, lines
    efficiency = next(line for line in lines if "efficiency" in line)
    figures = [float(word.rstrip(";")) for word in efficiency.split() if word[0].isdigit() and "." in word]
    assert len(figures) == 2 and all(FLOOR < f < 1.05 for f in figures), efficiency
    assert "  analyzer warnings, serve: none" in lines and any("clock offsets" in line for line in lines)


def test_the_ring_check_says_where_the_tokens_differ(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from benchmarks import ring_check

    got = iter([[[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 9, 6]]])  # one rank's, then the ring's
    monkeypatch.setattr(ring_check, "_run", lambda out, **kw: out)
    monkeypatch.setattr(ring_check, "_outputs", lambda run_dir: next(got))
    said = ring_check._same_tokens(tmp_path, "gloo", 2, 3, {"schedule": "gpipe"})
    assert said == "DIFFER from one rank's: request 1 first at token 1 ([4, 9, 6] against [4, 5, 6])"


def test_the_gpu_check_says_the_ring_is_not_checked_on_one_gpu(tmp_path: Path) -> None:
    from benchmarks.gpu_check import _ring

    assert _ring(tmp_path, 1) == ["ring over NCCL: not checked: it needs two or more GPUs and this machine has 1"]


@pytest.mark.slow
def test_the_gpu_path_check_a_multi_gpu_machine_runs_works_over_gloo(tmp_path: Path) -> None:
    """The GPU-path section of the GPU check, its GPU runs device-timed on a stand-in stream over gloo: one line
    per finding, offsets 0 on one host and found 0 by ping-pong, no causality violation. (Whether the causes
    agree is tests/test_engine_device_timed.py's to say: on a busy machine of few cores a gloo send can block
    for milliseconds now and then, which a single pair of runs cannot tell from a difference.)"""
    from benchmarks.gpu_path_check import gpu_path_checks

    lines = gpu_path_checks(tmp_path, "gloo", 2, stage_ms=20.0)
    print("\n".join(lines))
    assert lines[0] == "GPU path, 2 ranks over gloo:" and len(lines) == 6, lines
    causes, overlap, offsets, causality, counters = lines[1:]
    # a gpipe step's waits are its fill and drain (causes per step)
    shape = r"idle causes, gpipe, .* fill .* drain .*; worst difference \d\.\d{3}: (same|DIFFER)"
    assert re.search(shape, causes), causes
    assert "rank 0 " in overlap and "rank 1 " in overlap, overlap
    assert "rank 1 same-host +0.0" in offsets and "all within their uncertainty" in offsets, offsets
    assert causality.endswith("gpipe, CPU 0, gpipe, device 0, serve 0, ping-pong 0"), causality
    assert counters == "  counters: rank 0 cpu; rank 1 cpu", counters


def test_the_gpu_check_says_the_gpu_path_is_not_checked_on_one_gpu(tmp_path: Path) -> None:
    from benchmarks.gpu_check import _gpu_path

    assert _gpu_path(tmp_path, 1) == [
        "GPU path over NCCL: not checked: it needs two or more GPUs and this machine has 1"
    ]


@pytest.mark.slow
def test_the_one_gpu_check_runs_its_ranks_over_gloo(tmp_path: Path) -> None:
    """The one-GPU section of the GPU check, on the CPU: its two runs go through, and each finding is one line
    with the ratio it is about (the synthetic layers sleep their configured time on a CPU too)."""
    from benchmarks.one_gpu_check import LAYER_MS, gpu_entry, one_gpu_checks

    lines = one_gpu_checks(tmp_path, "cpu", model="tiny", dtype="bfloat16", gpu="h200")
    print("\n".join(lines))
    assert len(lines) == 6, lines
    forward0, forward1, extent, counters, layers, roofline = lines
    assert "rank 0 of 2 over gloo (cpu): forward spans ÷ configured 3 ms" in forward0, forward0
    assert "rank 1 of 2 over gloo (cpu): forward spans ÷ configured 7 ms" in forward1, forward1
    assert re.search(r"the requests' wall time = \d\.\d{3}", extent) and "0: 'cpu', 1: 'cpu'" in counters
    ratios = [float(r) for r in layers.split("= ")[-1].split(", ")]
    # each layer its own cost: a sleep never ends early, and ends late by the scheduler's delay, which a loaded
    # 2-core machine (CI) has made 0.7 ms on the median of a 1 ms layer: at most 1 ms late, whatever the cost
    assert len(ratios) == 4, layers
    assert all(r > 0.9 and (r - 1) * ms < 1.0 for r, ms in zip(ratios, LAYER_MS, strict=True)), layers
    assert "tiny decode layer, batch 8" in roofline and "on h200 =" in roofline, roofline
    assert gpu_entry("NVIDIA H200").name == "h200" and gpu_entry("NVIDIA H100 80GB HBM3").name.startswith("h100")
    assert gpu_entry("NVIDIA GeForce RTX 4090") is None
