"""Layer costs measured inside the run: the engine's `layer` spans (every k-th pass of each stage), the costs
taken from them, and the commands that use them by default and say so."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import pytest
from error_helpers import raises_code

from ppscope.balance.measured.choose import run_costs
from ppscope.balance.measured.insitu import has_layer_spans, insitu_costs
from ppscope.errors import ErrorCode, InvalidConfigError, UnsupportedInputError
from ppscope.trace.layers import layer_indices, layer_span_name
from ppscope.trace.model import Lane, SpanKind, Trace
from ppscope.trace.notices import NoticeCode
from ppscope.trace.store import load_run

LAYER_MS = (1.0, 2.0, 3.0, 4.0, 1.5, 2.5)
HEAD_MS = 4.0
EMBED_MS = 0.5
K = 3


def test_a_layer_span_names_its_layer_and_reads_back() -> None:
    assert layer_span_name(0) == "layer 0" and layer_span_name(17) == "layer 17"
    names = pd.Series(["layer 0", "layer 17", "layer", "layer -1", "layer 3x", "forward", "Layer 2", "layer  2"])
    assert layer_indices(names).tolist() == [0, 17, -1, -1, -1, -1, -1, -1]
    assert layer_indices(pd.Series([], dtype=str)).tolist() == []


def _near(got_ms: Sequence[float], want_ms: Sequence[float]) -> None:
    """Each cost the configured one: a sleep never ends early, and ends late by the scheduler's delay, which a
    loaded 2-core machine (CI) has made 0.7 ms on a median: no more than 0.1 ms early, 1 ms late."""
    assert len(got_ms) == len(want_ms), (got_ms, want_ms)
    assert all(w - 0.1 <= g <= w + 1.0 for g, w in zip(got_ms, want_ms, strict=True)), (got_ms, want_ms)


def _run(out: Path, every: int = K, stages: int = 2) -> Trace:
    pytest.importorskip("torch", reason="the engine needs torch")
    from ppscope.engine import config as c
    from ppscope.engine.launch import run

    cfg = c.EngineConfig(
        pipeline=c.PipelineConfig(stages=stages, schedule="serve"),
        model=c.ModelConfig(
            name="synthetic", layers=len(LAYER_MS), layer_cost_ms=LAYER_MS, head_cost_ms=HEAD_MS, embed_cost_ms=EMBED_MS
        ),
        workload=c.WorkloadConfig(requests=2, prompt_len=4, max_new_tokens=12),
        output=c.OutputConfig(progress=False, nvtx=False, out=out, layer_spans=every),
        runtime=c.RuntimeConfig(timeout_s=120),
    )
    return load_run(run(cfg))


@pytest.fixture(scope="module")
def sampled(tmp_path_factory: pytest.TempPathFactory) -> Trace:
    """2 stages (layers 0-2 and 3-5), 2 slots x 12 passes each: 24 passes per stage, layers timed in 8."""
    return _run(tmp_path_factory.mktemp("insitu") / "run")


def test_layers_are_timed_in_every_k_th_pass_of_each_stage(sampled: Trace) -> None:
    spans = sampled.spans
    for stage, layers in ((0, [0, 1, 2]), (1, [3, 4, 5])):
        fwd = spans[(spans["kind"] == SpanKind.FORWARD) & (spans["stage"] == stage)].sort_values("start_ns")
        lay = spans[(spans["kind"] == SpanKind.LAYER) & (spans["stage"] == stage)].copy()
        lay["layer"] = layer_indices(lay["name"])
        assert len(fwd) == 24
        # the k-th, 2k-th, ... pass of the stage, each with one span per layer it holds, in order, inside it
        sampled_passes = fwd.iloc[K - 1 :: K]
        assert len(lay) == len(sampled_passes) * len(layers)
        for _, f in sampled_passes.iterrows():
            inside = lay[(lay["start_ns"] >= f["start_ns"]) & (lay["end_ns"] <= f["end_ns"])].sort_values("start_ns")
            assert inside["layer"].tolist() == layers
            assert (inside[["mb", "step", "phase", "tokens"]] == f[["mb", "step", "phase", "tokens"]]).all().all()
        assert set(lay["lane"]) == {Lane.LAYERS} and (lay["chunk"] == 0).all()
    assert has_layer_spans(sampled)


def test_costs_from_layer_spans_are_the_synthetic_model_s(sampled: Trace) -> None:
    got = insitu_costs([sampled], phase="all")
    _near(got.costs.layer_ms, LAYER_MS)
    _near((got.costs.head_ms, got.costs.embed_ms), (HEAD_MS, EMBED_MS))
    assert got.passes == (8,) * len(LAYER_MS) and got.phase == "all" and got.runs == 1
    assert all(0 <= r < 0.5 for r in got.rest_ms)  # a synthetic pass does nothing outside its layers
    decode = insitu_costs([sampled])
    assert decode.phase == "decode"
    _near(decode.costs.layer_ms, LAYER_MS)
    # the layers' own costs, where a fit of whole stages can only share a stage's time among its layers
    fit = run_costs([sampled], None, choice="fit")
    assert fit.source == "fit" and fit.costs.layer_ms[0] == pytest.approx(fit.costs.layer_ms[2])
    auto = run_costs([sampled], None)
    assert auto.source == "insitu" and auto.insitu is not None and auto.costs == decode.costs
    assert auto.fit is not None  # the fit beside it, for comparison


def test_rebalance_takes_the_layer_spans_by_default_and_says_so(sampled: Trace) -> None:
    run_dir = Path(sampled.meta.config["out"])
    common = [sys.executable, "-m", "ppscope", "rebalance", str(run_dir), "--json"]
    out = subprocess.run(common, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["cost_source"] == "insitu" and got["insitu"]["phase"] == "decode"
    _near(got["costs"]["layer_ms"], LAYER_MS)
    # 1,2,3 | 4,1.5,2.5 + head 4: the last stage gives layer 3 away, 12 ms to 10.5 (the head is 4 ms so that
    # 1.5 ms, not 0.5, separates the splits: one stage's sleeps have run 0.3 ms later than the other's)
    assert got["current_split"] == [3, 3] and got["proposed_split"] == [4, 2]
    fit = subprocess.run([*common, "--costs", "fit"], capture_output=True, text=True, timeout=120)
    assert fit.returncode == 0 and json.loads(fit.stdout)["cost_source"] == "fit"
    text = subprocess.run(common[:-1], capture_output=True, text=True, timeout=120)
    assert "costs: timed layer by layer inside the run (decode passes, median of" in text.stdout


def test_without_layer_spans_there_are_no_in_situ_costs(tmp_path: Path) -> None:
    trace = _run(tmp_path / "off", every=0)
    assert not has_layer_spans(trace)
    with raises_code(UnsupportedInputError, ErrorCode.NO_LAYER_SPANS):
        insitu_costs([trace])
    with raises_code(UnsupportedInputError, ErrorCode.NO_LAYER_SPANS):
        run_costs([trace], None, choice="insitu")
    assert run_costs([trace], None).source == "fit"  # auto falls back to the fit


def test_too_few_sampled_passes_name_the_layers_missing(sampled: Trace) -> None:
    spans = sampled.spans
    keep = ~((spans["kind"] == SpanKind.LAYER) & (spans["name"] == layer_span_name(4)))
    trace = Trace(
        spans=spans[keep].reset_index(drop=True),
        counters=sampled.counters,
        requests=sampled.requests,
        meta=sampled.meta,
    )
    with raises_code(UnsupportedInputError, ErrorCode.TOO_FEW_SAMPLES):
        insitu_costs([trace])
    auto = run_costs([trace], None)  # auto goes on to the fit, and says why
    assert auto.source == "fit" and NoticeCode.INSITU_SET_ASIDE in {n.code for n in auto.notes}
    with raises_code(InvalidConfigError, ErrorCode.UNKNOWN_CHOICE):
        insitu_costs([sampled], phase="warm")


def test_the_layer_spans_option_is_checked() -> None:
    pytest.importorskip("torch", reason="the engine config lives in the engine")
    from ppscope.engine import config as c

    with raises_code(InvalidConfigError, ErrorCode.BAD_VALUE):
        c.OutputConfig(layer_spans=-1)
    with raises_code(InvalidConfigError, ErrorCode.CONFLICTING_OPTIONS):
        c.EngineConfig(output=c.OutputConfig(layer_spans=0), bench=c.BenchConfig(layer_spans_alternate_ms=10.0))


def test_a_device_timed_rank_times_its_layers_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU path (CUDA events through `DeviceSpans`), run on a CPU with the stand-in stream."""
    pytest.importorskip("torch", reason="the engine needs torch")
    from ppscope.engine.testing import DEVICE_TIMED_ENV

    monkeypatch.setenv(DEVICE_TIMED_ENV, "1")
    trace = _run(tmp_path / "device", every=2)
    got = insitu_costs([trace], phase="all")
    assert got.passes == (12,) * len(LAYER_MS)
    _near(got.costs.layer_ms, LAYER_MS)


@pytest.mark.gpu
def test_on_a_gpu_layers_are_timed_by_cuda_events(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="the engine needs torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    trace = _run(tmp_path / "gpu", every=2, stages=1)
    assert {r.device.split(":")[0] for r in trace.meta.ranks} == {"cuda"}
    got = insitu_costs([trace], phase="all")
    # the synthetic layers spin on the GPU for their cost: the events time the spin, not the launch
    assert got.costs.layer_ms == pytest.approx(LAYER_MS, rel=0.1)
