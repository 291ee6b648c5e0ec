"""The counter sampler: CPU usage where there is no GPU, NVML readings where there is, resident memory on
every rank; the GPU found in NVML by its UUID, never by a guessed index. NVML is replaced by a stand-in module
so the GPU path runs on any machine."""

from __future__ import annotations

import sys
import time
import types
from typing import Any, ClassVar

import pytest

pytest.importorskip("torch")

from ppscope.engine.usage import CounterSampler, NvmlGpu, find_gpu
from ppscope.trace.model import Metric
from ppscope.trace.notices import NoticeCode
from ppscope.trace.recorder import Recorder


def _sample(rec: Recorder, gpu: NvmlGpu | None, seconds: float = 1.0) -> dict[tuple[str, int], list[float]]:
    sampler = CounterSampler(rec, gpu, interval_ms=50)
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
    got = _sample(Recorder(None, nvtx=False), gpu=None)
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

    # No nvmlDeviceGetHandleByIndex: a device is looked up by its UUID only.
    GPUS: ClassVar[dict[str, int]] = {"GPU-0a1b": 3, "GPU-77ee": 1}  # UUID -> NVML's index (not CUDA's ordinal)
    MIGS: ClassVar[dict[str, str]] = {"MIG-5c5c": "GPU-77ee"}  # a MIG instance of GPU 1

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes) -> str:
        name = uuid.decode()
        if name not in self.GPUS and name not in self.MIGS:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return name

    def nvmlDeviceIsMigDeviceHandle(self, handle: str) -> bool:
        return handle in self.MIGS

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: str) -> str:
        return self.MIGS[handle]

    def nvmlDeviceGetIndex(self, handle: str) -> int:
        return self.GPUS[handle]

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
    gpu, counters = find_gpu("0a1b", ordinal=0)  # as CUDA gives it: no prefix
    assert gpu is not None and counters == "nvml GPU-0a1b" and gpu.index == 3
    got = _sample(Recorder(None, nvtx=False), gpu)
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
    got = _sample(Recorder(None, nvtx=False), find_gpu("GPU-0a1b")[0])
    assert (Metric.GPU_POWER_W, 3) not in got
    assert got[(Metric.GPU_SM_CLOCK_MHZ, 3)][0] == 1_755.0 and got[(Metric.GPU_UTIL_PCT, 3)][0] == 87.0


def test_a_disabled_recorder_starts_no_sampler_thread() -> None:
    sampler = CounterSampler(Recorder(None, enabled=False), None, interval_ms=10)
    sampler.start()
    assert sampler._thread is None
    sampler.stop()


def test_a_paused_recorder_gets_no_samples_until_resumed() -> None:
    rec = Recorder(None, nvtx=False)
    rec.set_paused(True)
    assert _sample(rec, gpu=None, seconds=0.2) == {}
    rec.set_paused(False)
    assert (Metric.CPU_UTIL_PCT, -1) in _sample(rec, gpu=None)


def test_a_mig_instance_is_found_by_its_own_uuid_and_counted_on_its_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml())
    gpu, counters = find_gpu("5c5c", ordinal=0)
    assert gpu is not None and gpu.handle == "MIG-5c5c" and counters == "nvml MIG-5c5c"
    assert gpu.index == 1  # the GPU it is part of, not physical GPU 0


def test_a_gpu_nvml_cannot_find_gets_cpu_counters_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpu, counters = find_gpu("dead", ordinal=0)
    assert gpu is None and fake.shut
    assert counters == "cpu: NVML has no device with UUID dead (GPU-dead or MIG-dead)"
    got = _sample(Recorder(None, nvtx=False), gpu)
    assert (Metric.CPU_UTIL_PCT, -1) in got and not any(device >= 0 for _, device in got)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    gpu, counters = find_gpu("0a1b", ordinal=0)
    assert gpu is None and counters.startswith("cpu: NVML is not available (")
    assert find_gpu(None) == (None, "cpu")


def test_the_analysis_says_which_gpu_ranks_fell_back_to_cpu_counters() -> None:
    from ppscope.analysis import analyze
    from ppscope.trace.model import RankInfo, Trace

    trace = Trace.from_records([{"rank": 0, "kind": "forward", "start_ns": 0, "end_ns": 10}])
    why = "cpu: NVML has no device with UUID dead (GPU-dead or MIG-dead)"
    trace.meta.ranks = [RankInfo(rank=0, counters=why)]
    said = [n.text for n in analyze(trace).warnings if n.code == NoticeCode.CPU_COUNTERS]
    assert len(said) == 1 and "rank 0" in said[0] and why.removeprefix("cpu: ") in said[0]  # the rank, and why
