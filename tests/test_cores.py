"""CPU stages sharing the machine's cores: the bound their total work puts on a split's predicted gain, and
how the cores busy beside a run are read."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppscope.balance.advice import Interval
from ppscope.balance.cores import MIN_FREE_CORES, beat_ms, pipeline_cores, shared_cores
from ppscope.cli.tuning import busy_cores

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
    assert "1.0 busy beside the run" in got.text() and "through the bound" in got.interval.how
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
    monkeypatch.setattr("ppscope.cli.tuning.time.sleep", sleep)
    # 200 busy of 400 jiffies on 2 CPUs: one core's worth
    assert busy_cores(0.0, str(stat)) == pytest.approx(1.0)
    assert busy_cores(0.0, str(tmp_path / "none")) is None


@pytest.mark.slow
def test_tune_on_cpus_bounds_the_prediction_by_the_cores_busy_beside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch", reason="the engine needs torch")
    from ppscope.cli import tuning
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
    assert not result.decision.change and "the stages share 2 core(s) with 3.0 busy beside" in result.decision.reason
    data = result.to_dict()
    assert data["slowest_stage_speedup"] == result.advice.predicted_speedup and data["cores"]["cores"] == 2
    assert data["predicted_speedup"] == result.predicted_speedup
