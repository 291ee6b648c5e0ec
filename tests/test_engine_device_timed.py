"""The engine's device-timed path, a GPU rank's (spans timed through `ppscope.engine.gputime`, headers on
groups of their own, every payload a message of its own), run on CPUs with a stand-in stream that the host
runs (PPSCOPE_TEST_DEVICE_TIMED), against the same run timed on the host."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppscope.analysis import AnalysisConfig, analyze
from ppscope.formats.sources import open_trace

pytest.importorskip("torch", reason="the engine needs torch")
pytestmark = pytest.mark.slow

P = 3
ATTEMPTS = 3
NOISE = 0.05
"""How far a cause's share of the window may differ between two runs of the same pipeline on a busy machine."""


def _shares(out: Path, device_timed: bool, monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """Each idle cause's share of P x the active window, in a gpipe run of the synthetic model."""
    from ppscope.engine import config as c
    from ppscope.engine.launch import run
    from ppscope.engine.testing import DEVICE_TIMED_ENV

    if device_timed:
        monkeypatch.setenv(DEVICE_TIMED_ENV, "1")
    else:
        monkeypatch.delenv(DEVICE_TIMED_ENV, raising=False)
    cfg = c.EngineConfig(
        pipeline=c.PipelineConfig(stages=P, schedule="gpipe", microbatches=P),
        model=c.ModelConfig(name="synthetic", layers=P, layer_cost_ms=(30.0,)),
        workload=c.WorkloadConfig(requests=P, max_new_tokens=4),
        output=c.OutputConfig(progress=False, nvtx=False, out=out),
        runtime=c.RuntimeConfig(timeout_s=120),
    )
    res = analyze(open_trace(run(cfg)), AnalysisConfig(active=True))
    assert res.window is not None
    total = res.pp_size * res.window.length_ns
    return {cause: sum(s.causes[cause] for s in res.stages) / total for cause in res.stages[0].causes}


def test_a_device_timed_run_gives_the_causes_of_a_host_timed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU the host's wait for a header is a `recv_wait` too (compute spans take precedence, so only idle
    device time counts), so a step boundary and an upstream wait read as they do on CPUs, not as `host`."""
    for attempt in range(ATTEMPTS):
        host = _shares(tmp_path / f"host{attempt}", False, monkeypatch)
        device = _shares(tmp_path / f"device{attempt}", True, monkeypatch)
        worst = max(abs(host[c] - device[c]) for c in host)
        print(f"host-timed {host}\ndevice-timed {device}\nworst difference {worst:.3f}")
        if worst <= NOISE and device["host"] <= NOISE:
            break
    assert device["host"] <= NOISE, device
    assert worst <= NOISE, (host, device)
    # the waits that used to read as host time: a gpipe step's edges are its fill and drain (causes per step)
    waits = device["upstream"] + device["dependency"] + device["fill"] + device["drain"]
    assert waits > 2 * NOISE
