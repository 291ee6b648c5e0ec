"""CPU stages sharing the machine's cores: the bound their total work puts on a split's predicted gain, and
how the cores busy beside a run are read."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppscope.balance.advise.advice import Interval
from ppscope.balance.advise.cores import MIN_FREE_CORES, RunUsage, beat_ms, pipeline_cores, run_usage, shared_cores
from ppscope.engine.machine_load import LoadSampler
from ppscope.engine.tuning import busy_cores
from ppscope.trace.model import RankInfo, RunMeta, SpanKind, Trace

NOW = (4.8, 6.4)  # the tiny model's 4,4 on two stages: embedding + 4 layers | 4 layers + head + sampling
NEW = (5.7, 5.5)  # 5,3


def test_with_a_core_per_stage_the_slowest_stage_decides() -> None:
    got = shared_cores(NOW, NEW, cores=4, busy_beside=0.5)
    assert got.free == 3.5 and pipeline_cores(4, 0.5, 2) == 3.5 and not got.binds
    assert got.speedup == pytest.approx(6.4 / 5.7) == got.slowest_stage_speedup


def test_stages_sharing_too_few_cores_are_bound_by_their_total_work() -> None:
    # beside a busy loop on one of two cores the two stages have 2 x 2/3 of the machine: a beat is all their
    # work over 1.33 cores, either split
    got = shared_cores(NOW, NEW, cores=2, busy_beside=1.0, interval=Interval(low=1.05, high=1.2, how="bootstrap"))
    assert got.free == pytest.approx(4 / 3) and got.binds
    assert beat_ms(NOW, 4 / 3) == pytest.approx(8.4) and beat_ms(NEW, 4 / 3) == pytest.approx(8.4)
    assert got.speedup == pytest.approx(1.0) and got.slowest_stage_speedup == pytest.approx(6.4 / 5.7)
    assert got.interval is not None
    assert got.interval.low == pytest.approx(1.0) and got.interval.high == pytest.approx(1.0)
    assert "used 1.0 of this machine's 2 cores" in got.text() and "through the bound" in got.interval.how
    # part way: 2 x 2/2.1 cores let 4,4 run at its slowest stage and bound 5,3 by the total work
    part = shared_cores(NOW, NEW, cores=2, busy_beside=0.1)
    assert part.binds and part.speedup == pytest.approx(6.4 / (11.2 / (4 / 2.1)))
    assert 1.0 < part.speedup < part.slowest_stage_speedup


def test_a_fully_busy_machine_still_leaves_the_pipeline_a_share() -> None:
    got = shared_cores(NOW, NEW, cores=2, busy_beside=3.0)
    assert got.free == pytest.approx(0.8) and got.speedup == pytest.approx(1.0)
    assert pipeline_cores(1, 1000.0, 2) == MIN_FREE_CORES


def test_busy_cores_reads_the_kernel_s_cpu_times(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal, for all CPUs, then one line per CPU
    per_cpu = "cpu0 1\ncpu1 1\n"
    lines = iter([f"cpu  100 0 100 800 0 0 0 0 0 0\n{per_cpu}", f"cpu  250 0 150 1000 0 0 0 0 0 0\n{per_cpu}"])

    def sleep(_s: float) -> None:
        stat.write_text(next(lines, ""))

    stat.write_text(next(lines))
    monkeypatch.setattr("ppscope.engine.machine_load.time.sleep", sleep)
    # 200 busy of 400 jiffies on 2 CPUs: one core's worth
    assert busy_cores(0.0, str(stat)) == pytest.approx(1.0)
    assert busy_cores(0.0, str(tmp_path / "none")) is None


def test_work_the_stage_times_miss_tightens_the_bound() -> None:
    """Ranks busy 0.75 and 1.0 cores while stage 1 is modelled at 6.4 ms: a beat costs them 1.75 x 6.4 =
    11.2 ms of CPU at least, the modelled 11.2 plus nothing; at 0.9 and 1.0, 12.16, 0.96 ms more. With the
    launcher and the kernel busy 0.15 of the 2 cores meanwhile, the stages get their fair share, 2 x 2/2.15."""
    assert RunUsage(ranks={0: 0.75, 1: 1.0}).extra_ms(NOW) == pytest.approx(0.0)
    usage = RunUsage(ranks={0: 0.9, 1: 1.0}, machine=2.05)
    assert usage.extra_ms(NOW) == pytest.approx(1.9 * 6.4 - 11.2) and usage.beside == pytest.approx(0.15)
    assert RunUsage(ranks={1: 1.0}).extra_ms(NOW) == 0.0 and RunUsage().beside == 0.0  # a rank unmeasured
    got = shared_cores(NOW, NEW, cores=2, busy_beside=usage.beside, extra_ms=usage.extra_ms(NOW))
    free = 2 * 2 / 2.15
    assert got.free == pytest.approx(free) and got.binds and got.extra_ms == pytest.approx(0.96)
    assert got.speedup == pytest.approx(1.0)  # both splits wait on the CPU: 12.16 ms over 1.86 cores a beat
    assert "spent 0.96 ms per step outside the timed work" in got.text()
    assert beat_ms(NOW, 1.85, 0.96) == pytest.approx((11.2 + 0.96) / 1.85)


def test_a_serve_loop_with_as_many_micro_batches_as_stages_is_bound_by_its_round_trip() -> None:
    """Two micro-batches round two stages with 0.5 ms hops: a round trip is 11.2 ms of stages plus 1 ms, 6.1 ms
    a beat for each micro-batch; 4,4's slowest stage (6.4) still sets its pace, 5,3's (5.7) no longer does."""
    got = shared_cores(NOW, NEW, cores=4, busy_beside=0.0, loop_ms=1.0, inflight=2)
    assert beat_ms(NOW, 4.0, loop_ms=1.0, inflight=2) == pytest.approx(6.4)
    assert beat_ms(NEW, 4.0, loop_ms=1.0, inflight=2) == pytest.approx(6.1)
    assert (
        got.binds and got.speedup == pytest.approx(6.4 / 6.1) and got.slowest_stage_speedup == pytest.approx(6.4 / 5.7)
    )
    assert "each token also waits 1.00 ms for the hops between stages" in got.text()
    assert not shared_cores(NOW, NEW, cores=4, busy_beside=0.0, loop_ms=1.0, inflight=4).binds  # room to spare


def test_run_usage_reads_the_ranks_counters_over_the_steady_part() -> None:
    ms = 1_000_000
    spans = [
        {
            "rank": r,
            "stage": r,
            "kind": SpanKind.FORWARD,
            "mb": 0,
            "step": i,
            "start_ns": i * 10 * ms,
            "end_ns": i * 10 * ms + 5 * ms,
        }
        for r in (0, 1)
        for i in range(100)
    ]
    # start-up and tail (the first and last tenth) at 100%, the steady part at 60% and 90%
    counters = [
        (t * ms, r, -1, "cpu_util_pct", (60.0 if r == 0 else 90.0) if 100 <= t < 900 else 100.0)
        for r in (0, 1)
        for t in range(0, 1000, 20)
    ]
    meta = RunMeta(world_size=2, pp_size=2, split=[2, 2], ranks=[RankInfo(rank=0, stage=1), RankInfo(rank=1, stage=0)])
    trace = Trace.from_records(spans, counters=counters, meta=meta)
    asked: list[tuple[int, int]] = []
    usage = run_usage(trace, lambda start, end: asked.append((start, end)) or 1.7)
    assert usage.ranks == {1: pytest.approx(0.6), 0: pytest.approx(0.9)}  # by stage: rank 0 holds stage 1
    assert asked == [(99_500_000, 895_500_000)]  # the forward spans' extent, 0-995 ms, less a tenth each end
    assert usage.machine == 1.7 and usage.beside == pytest.approx(0.2)
    assert run_usage(Trace.from_records(spans, meta=meta)) == RunUsage()  # no counters: nothing measured


def test_the_load_sampler_reads_the_machine_over_a_window(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    per_cpu = "cpu0 1\ncpu1 1\n"
    ticks = iter([(100, 1000), (300, 1400), (700, 1800), (900, 2200)])  # busy, total jiffies
    now = iter([0, 10, 20, 30])
    sampler = LoadSampler(stat=str(stat), clock=lambda: next(now))
    for busy, total in ticks:
        stat.write_text(f"cpu  {busy} 0 0 {total - busy} 0 0 0 0 0 0\n{per_cpu}")
        sampler.sample()
    assert sampler.busy_between(10, 20) == pytest.approx(400 / 400 * 2)  # samples at 10 and 20
    assert sampler.busy_between(5, 25) == pytest.approx((900 - 100) / (2200 - 1000) * 2)  # at 0 and 30
    assert sampler.busy_between(-1, 20) is None and sampler.busy_between(10, 31) is None
    with LoadSampler(interval_s=0.01, stat=str(tmp_path / "none")) as missing:
        pass
    assert missing.samples == [] and missing.busy_between(0, 1) is None


@pytest.mark.slow
def test_tune_on_cpus_bounds_the_prediction_by_the_cores_busy_beside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch", reason="the engine needs torch")
    from ppscope.engine import tuning
    from ppscope.engine.config import EngineConfig, OutputConfig, PipelineConfig, WorkloadConfig

    cfg = EngineConfig(
        pipeline=PipelineConfig(stages=2, split=(1, 7)),
        workload=WorkloadConfig(requests=2, prompt_len=4, max_new_tokens=16),
        output=OutputConfig(progress=False, nvtx=False, layer_spans=2),
    )
    # a machine of 2 cores with 3 busy beside the run: the stages get 0.8 of a core, their total work sets the
    # pace, and 1,7's gain from moving layers to the first stage is gone
    monkeypatch.setattr(tuning, "busy_cores", lambda: 3.0)
    monkeypatch.setattr(tuning.os, "cpu_count", lambda: 2)
    result = tuning.tune(cfg, out_dir=tmp_path / "t")
    assert result.cost_source == "insitu" and result.cores is not None and result.cores.binds
    assert result.cores.free == pytest.approx(0.8) and result.cores.busy_beside == 3.0
    assert result.advice.predicted_speedup > 1.5  # 1,7 leaves the last stage far the slowest
    assert result.predicted_speedup == pytest.approx(1.0, abs=0.05) and result.decision is not None
    assert not result.decision.change and "3.0 of this machine's 2 cores" in result.decision.reason
    data = result.to_dict()
    assert data["slowest_stage_speedup"] == result.advice.predicted_speedup and data["cores"]["cores"] == 2
    assert data["predicted_speedup"] == result.predicted_speedup
