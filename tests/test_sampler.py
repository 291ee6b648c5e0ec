"""The counter sampler: CPU usage where there is no GPU, NVML readings where there is, resident memory on
every rank. NVML is replaced by a stand-in module so the GPU path runs on any machine."""

from __future__ import annotations

import sys
import time
import types
from typing import Any

import pytest

pytest.importorskip("torch")

from ppscope.engine.usage import CounterSampler
from ppscope.trace.model import Metric
from ppscope.trace.recorder import Recorder


def _sample(rec: Recorder, gpu_index: int | None, seconds: float = 1.0) -> dict[tuple[str, int], list[float]]:
    sampler = CounterSampler(rec, gpu_index, interval_ms=50)
    sampler.start()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:  # some CPU use to measure
        sum(i * i for i in range(2_000))
    sampler.stop()
    rec.flush()
    got: dict[tuple[str, int], list[float]] = {}
    for _, _, device, metric, value in rec._kept_counters:
        got.setdefault((metric, device), []).append(value)
    return got


def test_cpu_ranks_record_cpu_usage_and_resident_memory() -> None:
    got = _sample(Recorder(None, nvtx=False), gpu_index=None)
    cpu = got[(Metric.CPU_UTIL_PCT, -1)]
    rss = got[(Metric.RSS_BYTES, -1)]
    assert len(cpu) >= 3 and all(0.0 <= v <= 100.0 * 8 for v in cpu)
    assert max(cpu) > 10.0  # the loop above kept a core busy
    assert len(rss) >= 3 and all(v > 10 * 2**20 for v in rss)  # a Python process with torch holds > 10 MiB


class _FakeNvml(types.ModuleType):
    NVML_CLOCK_SM = 1

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.shut = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"gpu{index}"

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> Any:
        return types.SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> Any:
        return types.SimpleNamespace(used=30 * 2**30, total=80 * 2**30)

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        return 412_000  # milliwatts

    def nvmlDeviceGetClockInfo(self, handle: str, kind: int) -> int:
        return 1_755


def test_gpu_ranks_record_nvml_readings_and_resident_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    got = _sample(Recorder(None, nvtx=False), gpu_index=3)
    assert got[(Metric.GPU_UTIL_PCT, 3)][0] == 87.0
    assert got[(Metric.GPU_MEM_USED_BYTES, 3)][0] == 30 * 2**30
    assert got[(Metric.GPU_POWER_W, 3)][0] == pytest.approx(412.0)
    assert got[(Metric.GPU_SM_CLOCK_MHZ, 3)][0] == 1_755.0
    assert (Metric.CPU_UTIL_PCT, -1) not in got  # GPU ranks report the GPU, not the CPU
    assert len(got[(Metric.RSS_BYTES, -1)]) >= 3  # but their host memory too (the soak reads it)
    assert fake.shut


def test_a_metric_the_gpu_does_not_report_is_skipped_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoPower(_FakeNvml):
        def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")  # as on some virtual GPUs

    monkeypatch.setitem(sys.modules, "pynvml", NoPower())
    got = _sample(Recorder(None, nvtx=False), gpu_index=0)
    assert (Metric.GPU_POWER_W, 0) not in got
    assert got[(Metric.GPU_SM_CLOCK_MHZ, 0)][0] == 1_755.0 and got[(Metric.GPU_UTIL_PCT, 0)][0] == 87.0


def test_a_disabled_recorder_starts_no_sampler_thread() -> None:
    sampler = CounterSampler(Recorder(None, enabled=False), None, interval_ms=10)
    sampler.start()
    assert sampler._thread is None
    sampler.stop()


def test_a_paused_recorder_gets_no_samples_until_resumed() -> None:
    rec = Recorder(None, nvtx=False)
    rec.set_paused(True)
    assert _sample(rec, gpu_index=None, seconds=0.2) == {}
    rec.set_paused(False)
    assert (Metric.CPU_UTIL_PCT, -1) in _sample(rec, gpu_index=None)
