"""The closed loop on a deliberately imbalanced synthetic pipeline: measured gain vs predicted gain; and the
layer profile of a real model against the pipeline it is meant to predict.

1. Four stages of 5 ms layers with an LM head worth three layers: vLLM's default split leaves the last stage
   the bottleneck. `ppscope.engine.tuning` profiles the layers, rebalances, re-runs; the reference is run 1 itself.
2. The tiny model on 2 stages: each stage's compute per decode step predicted by the profile (timed from
   cold caches, and back to back for comparison) ÷ what the run measured, stage by stage.
3. A gpipe run of the synthetic engine replayed by the simulator (`replay_config`): simulated throughput ÷
   measured, the reference being the run itself.
`ppscope demo` itself is `benchmarks/bench_demo.py`.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.record import Figure


def main() -> list[Figure]:
    from ppscope.engine.config import EngineConfig, ModelConfig, OutputConfig, PipelineConfig, WorkloadConfig
    from ppscope.engine.tuning import tune

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
    assert result.after is not None
    measured = result.measured_speedup or 0.0
    split = ",".join(map(str, result.after.split))
    simulated = (
        [
            Figure(
                f"tune: measured speedup against the simulator's (run 1's hop latency "
                f"{result.simulated.hop_latency_ns / 1e3:.0f} µs)",
                measured,
                "x",
                "the simulated speedup",
                result.simulated.speedup,
            )
        ]
        if result.simulated
        else [Figure("tune: measured speedup against the simulator's", "no simulated prediction")]
    )
    return [
        Figure(
            "tune: the split it finds (synthetic, 4 stages, 8 x 5 ms layers, 15 ms head, serve, 16 requests x 24 "
            "tokens)",
            split,
            reference_name=f"vLLM's default split, {','.join(map(str, result.before.split))}",
        ),
        Figure(
            "tune: throughput of run 2, on its split",
            result.after.throughput_tokens_per_s,
            "tokens/s",
            "run 1, on the default split",
            result.before.throughput_tokens_per_s,
            ratio=measured,
        ),
        Figure(
            "tune: measured speedup (ratio: measured gain ÷ predicted gain)",
            measured,
            "x",
            "the predicted speedup",
            result.predicted_speedup,
            ratio=float("nan") if result.realised is None else result.realised,
            target=">= 0.90",
            met=(result.realised or 0.0) >= 0.90,
        ),
        *simulated,
        *profiled,
        replayed,
    ]


def profile_vs_run(tmp: Path, stages: int = 2, device: str | None = None) -> list[Figure]:
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
    figures = []
    for cold in (True, False):
        prof = profile_layers(cfg, device=device, cold=cold)
        predicted = evaluate(BalanceProblem(costs=prof.decode.costs(), stages=stages), split).stage_ms
        what = f"profile ({prof.how}) vs run, tiny model, {stages} stage(s), split {','.join(map(str, split))}"
        figures += [
            Figure(f"{what}: stage {i}'s decode-step compute, predicted", p, "ms", "measured in the run", m)
            for i, (p, m) in enumerate(zip(predicted, measured, strict=True))
        ]
        figures.append(
            Figure(
                f"profile ({prof.how}): the head",
                prof.decode.head_ms,
                "ms",
                "the median layer",
                statistics.median(prof.decode.layer_ms),
            )
        )
    return figures


def replay_vs_run(tmp: Path) -> Figure:
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
    got = compare(trace, simulate(replay))
    return Figure(
        f"replay of a gpipe run (synthetic, 4 stages, 16 x 2 ms layers, 6 ms head, 4 micro-batches x 6 steps; hop "
        f"latency {replay.comm.latency_us:.0f} µs, host gap {replay.overhead_ms:.3f} ms an action): the run's "
        "measured time (ratio: simulated ÷ measured throughput)",
        got["measured_ms"],
        "ms",
        "the simulator's replay of it",
        got["predicted_ms"],
        ratio=1 + got["throughput_error"],
    )


def _stage_step_ms(trace: Any) -> list[float]:
    """Per stage, its compute per decode pass: embedding, forward, head and sampling (`observe_stages`)."""
    from ppscope.balance.measured.fit import observe_stages

    return [
        o.forward_ms + (o.embed_ms or 0) + (o.head_ms or 0) + (o.sample_ms or 0)
        for o in observe_stages(trace, phase="decode")
    ]


if __name__ == "__main__":
    for figure in main():
        print(figure)
