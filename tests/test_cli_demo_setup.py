"""`ppscope demo`'s defaults: emulated GPU stages with fewer than 2 GPUs, the model computed otherwise, the tiny
model's limits said once; and the dashboard link that opens on what the demo found."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from ppscope.cli.commands import demo
from ppscope.cli.engine_options import engine_config
from ppscope.engine.config import EngineConfig
from ppscope.engine.tuning import RunSummary
from ppscope.errors import InvalidConfigError
from ppscope.trace.notices import NoticeCode


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    demo.register(sub)
    return parser.parse_args(["demo", *argv])


def _config(args: argparse.Namespace) -> tuple[EngineConfig, list[str]]:
    given, notes = demo._setup(args)
    return engine_config(args, stages=demo.default_stages(bool(given["emulate"])), **given), notes


def test_without_gpus_the_demo_emulates_llama3_8b_on_four_h100_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo, "gpu_count", lambda: 0)
    cfg, notes = _config(_args())
    assert cfg.emulate.model == "llama3-8b" and cfg.emulate.gpu == "h100-sxm" and cfg.model.synthetic
    assert cfg.pipeline.stages == 4 and cfg.model.layers == 32 and not notes
    assert (cfg.workload.requests, cfg.workload.max_new_tokens) == (8, 40)
    other, _ = _config(_args("--emulate", "llama3-70b", "--gpu", "a100-80gb", "--requests", "3"))
    assert other.emulate.model == "llama3-70b" and other.emulate.gpu == "a100-80gb" and other.workload.requests == 3


def test_model_tiny_computes_on_the_cpus_and_says_its_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo, "gpu_count", lambda: 0)
    monkeypatch.setattr(demo.os, "cpu_count", lambda: 2)
    cfg, notes = _config(_args("--model", "tiny"))
    assert not cfg.emulate.on and cfg.model.name == "tiny" and cfg.pipeline.stages == 2
    assert (cfg.workload.requests, cfg.workload.max_new_tokens) == (16, 64)
    assert [n.code for n in notes] == [NoticeCode.DEMO_LIMITS] and demo.TINY_LIMITS in notes[0].text
    with pytest.raises(InvalidConfigError, match="--emulate and --gpu need the emulated demo"):
        demo._setup(_args("--model", "tiny", "--gpu", "h100-sxm"))


def test_with_two_gpus_the_demo_runs_the_model_itself_one_stage_per_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo, "gpu_count", lambda: 2)
    given, notes = demo._setup(_args())
    assert given["model"] == demo.EMULATED and given["emulate"] == "" and not notes
    assert demo.default_stages(emulated=False) == 2


def test_the_dashboard_link_opens_on_the_comparison_or_on_run_1() -> None:
    class Result:
        def __init__(self, after: RunSummary | None) -> None:
            self.before = _run("1-before")
            self.after = after

    out = Path("runs/demo-1")
    changed = demo.dashboard_link("http://h:1", out, Result(_run("2-after")))  # type: ignore[arg-type]
    assert changed == "http://h:1/?section=Compare&trace=demo-1%2F1-before&compare_with=demo-1%2F2-after"
    kept = demo.dashboard_link("http://h:1", out, Result(None))  # type: ignore[arg-type]
    assert kept == "http://h:1/?section=Timeline&trace=demo-1%2F1-before"


def _run(name: str) -> RunSummary:
    return RunSummary(
        run_dir=Path("runs/demo-1") / name,
        split=(4, 4),
        throughput_tokens_per_s=1.0,
        bubble_ratio=0.1,
        bottleneck_stage=0,
        time_per_mb_ns=(1_000_000, 1_000_000),
    )
