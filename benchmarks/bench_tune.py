"""The closed loop on a deliberately imbalanced synthetic pipeline: measured gain vs predicted gain; and the
layer profile of a real model against the pipeline it is meant to predict.

1. Four stages of 5 ms layers with an LM head worth three layers: vLLM's default split leaves the last stage
   the bottleneck. `ppscope.cli.tuning` profiles the layers, rebalances, re-runs; the reference is run 1 itself.
2. The tiny model on 2 stages: each stage's compute per decode step predicted by the profile (timed from
   cold caches, and back to back for comparison) ÷ what the run measured, stage by stage.
3. A gpipe run of the synthetic engine replayed by the simulator (`replay_config`): simulated throughput ÷
   measured, the reference being the run itself.
4. `ppscope demo` itself, five times as a new user runs it (the tiny model, in-situ costs), one of them beside a
   busy loop on one core: measured gain ÷ predicted gain per run, and whether an advised split ever measured
   slower than the given one beyond its interval.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def main() -> list[str]:
    from ppscope.cli.tuning import tune
    from ppscope.engine.config import EngineConfig, ModelConfig, OutputConfig, PipelineConfig, WorkloadConfig

    cfg = EngineConfig(
        pipeline=PipelineConfig(stages=4, schedule="serve"),
        model=ModelConfig(name="synthetic", layers=8, layer_cost_ms=(5.0,), head_cost_ms=15.0),
        workload=WorkloadConfig(requests=16, prompt_len=8, max_new_tokens=24),
        output=OutputConfig(progress=False, nvtx=False),
    )
    with tempfile.TemporaryDirectory() as tmp:
        result = tune(cfg, out_dir=Path(tmp) / "tune", cost_source="profile")
        profiled = profile_vs_run(Path(tmp))
        replayed = replay_vs_run(Path(tmp))
        demos = demo_runs(Path(tmp))
    assert result.after is not None
    measured = result.measured_speedup or 0.0
    realised = result.realised or 0.0
    return [
        f"tune: split {','.join(map(str, result.before.split))} -> {','.join(map(str, result.after.split))} "
        f"(synthetic, 4 stages, 8 x 5 ms layers, 15 ms head, serve, 16 requests x 24 tokens)",
        f"tune: predicted speedup x{result.predicted_speedup:.3f}, measured x{measured:.3f} "
        f"(throughput of run 2 / run 1: {result.after.throughput_tokens_per_s:.1f} / "
        f"{result.before.throughput_tokens_per_s:.1f} tokens/s)",
        f"tune: measured gain / predicted gain = {realised:.2f} (target >= 0.90)",
        f"tune: simulated speedup x{result.simulated.speedup:.3f} (run 1's hop latency "
        f"{result.simulated.hop_latency_us:.0f} us); measured / simulated = {measured / result.simulated.speedup:.3f}"
        if result.simulated
        else "tune: no simulated prediction",
        *profiled,
        replayed,
        *demos,
    ]


DEMO_RUNS = 5
BUSY_RUN = 3
"""Which of the demo runs has a busy loop on one core beside it (0-based)."""


def demo_runs(tmp: Path, runs: int = DEMO_RUNS, busy: int = BUSY_RUN) -> list[str]:
    """`ppscope demo --no-dashboard --json` `runs` times, run `busy` beside a process spinning on one core."""
    lines, shares, slower = [], [], 0
    for i in range(runs):
        spinner = _busy_loop() if i == busy else None
        try:
            done = subprocess.run(
                [sys.executable, "-m", "ppscope", "demo", "--no-dashboard", "--json", "--out", str(tmp / f"demo-{i}")],
                capture_output=True,
                text=True,
                timeout=1200,
            )
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
        if done.returncode != 0:
            lines.append(f"demo run {i + 1}: failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        d = json.loads(done.stdout)
        share, low_high = d["realised_share_of_predicted_gain"], d["measured_interval"]
        split = "→".join(",".join(map(str, s["split"])) for s in (d["tune"]["before"], d["tune"]["after"]) if s)
        below = d["advice"] == "change" and low_high is not None and low_high[1] < 1.0
        slower += below
        if d["advice"] == "change" and share is not None:
            shares.append(share)
        cores = d["tune"]["cores"]
        beside = "" if cores is None else f", {cores['busy_beside']:.1f} of {cores['cores']} cores busy beside it"
        lines.append(
            f"demo run {i + 1}{' (a busy loop on one core beside it)' if i == busy else ''}: {split}, "
            f"{d['cost_source']} costs{beside}, slowest stage ×{d['tune']['slowest_stage_speedup']:.3f}, "
            f"predicted ×{d['predicted_speedup']:.3f} {_interval(d['predicted_interval'])}, "
            f"measured ×{d['measured_speedup']:.3f} {_interval(low_high)}, advice {d['advice']}; measured gain ÷ "
            f"predicted gain = {'–' if share is None else f'{share:.2f}'}"
            + ("; the advised split measured slower beyond its interval" if below else "")
        )
    lines.append(
        f"demo: measured gain ÷ predicted gain >= 0.8 in {sum(s >= 0.8 for s in shares)} of {len(shares)} runs "
        f"that advised a change (target: all; shares {', '.join(f'{s:.2f}' for s in shares)}); the others "
        f"advised keeping the split; advised "
        f"splits measured slower than the given one beyond their interval: {slower} (target 0). Load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end."
    )
    return lines


def _interval(pair: list[float] | None) -> str:
    return "(no interval)" if pair is None else f"(95% {pair[0]:.3f}-{pair[1]:.3f})"


def _busy_loop() -> subprocess.Popen[bytes]:
    """A process spinning on one core (core 0 where the OS lets it choose), as other work on the machine."""
    code = "import os\nif hasattr(os, 'sched_setaffinity'): os.sched_setaffinity(0, {0})\nwhile True: pass"
    return subprocess.Popen([sys.executable, "-c", code])


def profile_vs_run(tmp: Path, stages: int = 2, device: str | None = None) -> list[str]:
    """Each stage's predicted decode-step compute ÷ its measured median, for a cold and a warm profile."""
    from ppscope.balance.advise.problem import BalanceProblem
    from ppscope.balance.advise.rebalance import evaluate
    from ppscope.engine.config import EngineConfig, ModelConfig, OutputConfig, PipelineConfig, WorkloadConfig
    from ppscope.engine.launch import run
    from ppscope.engine.profiler import profile_layers
    from ppscope.trace.store import load_run

    cfg = EngineConfig(
        pipeline=PipelineConfig(stages=stages, schedule="serve"),
        model=ModelConfig(name="tiny"),
        workload=WorkloadConfig(requests=16, prompt_len=16, max_new_tokens=32),
        output=OutputConfig(progress=False, out=tmp / f"profiled-{stages}"),
    )
    trace = load_run(run(cfg))
    measured = _stage_step_ms(trace)
    split = tuple(trace.meta.split)
    lines = []
    for cold in (True, False):
        prof = profile_layers(cfg, device=device, cold=cold)
        predicted = evaluate(BalanceProblem(costs=prof.decode.costs(), stages=stages), split).stage_ms
        ratios = ", ".join(f"{p / m:.2f}" for p, m in zip(predicted, measured, strict=True))
        lines.append(
            f"profile ({prof.how}) vs run, tiny model, {stages} stage(s), split {','.join(map(str, split))}: "
            f"predicted ÷ measured decode-step compute per stage = {ratios} (measured "
            f"{', '.join(f'{m:.3f}' for m in measured)} ms); head ÷ median layer "
            f"{prof.decode.head_ms / statistics.median(prof.decode.layer_ms):.2f}"
        )
    return lines


def replay_vs_run(tmp: Path) -> str:
    """The simulator calibrated on one engine run (4 stages, gpipe) ÷ that run, in throughput."""
    from ppscope.engine.config import EngineConfig, ModelConfig, OutputConfig, PipelineConfig, WorkloadConfig
    from ppscope.engine.launch import run
    from ppscope.simulate.calibrate import compare, replay_config
    from ppscope.simulate.simulator import simulate
    from ppscope.trace.store import load_run

    cfg = EngineConfig(
        pipeline=PipelineConfig(stages=4, schedule="gpipe", microbatches=4),
        model=ModelConfig(name="synthetic", layers=16, layer_cost_ms=(2.0,), embed_cost_ms=1.0, head_cost_ms=6.0),
        workload=WorkloadConfig(requests=8, max_new_tokens=6),
        output=OutputConfig(progress=False, nvtx=False, out=tmp / "replayed"),
    )
    trace = load_run(run(cfg))
    replay = replay_config(trace)
    error = compare(trace, simulate(replay))["throughput_error"]
    return (
        f"replay of a gpipe run (synthetic, 4 stages, 16 x 2 ms layers, 6 ms head, 4 micro-batches x 6 steps): "
        f"simulated ÷ measured throughput = {1 + error:.3f} (hop latency {replay.comm.latency_us:.0f} us, host "
        f"gap {replay.overhead_ms:.3f} ms per action)"
    )


def _stage_step_ms(trace: Any) -> list[float]:
    """Per stage, its compute per decode pass: embedding, forward, head and sampling (`observe_stages`)."""
    from ppscope.balance.measured.fit import observe_stages

    return [
        o.forward_ms + (o.embed_ms or 0) + (o.head_ms or 0) + (o.sample_ms or 0)
        for o in observe_stages(trace, phase="decode")
    ]


if __name__ == "__main__":
    print("\n".join(main()))
