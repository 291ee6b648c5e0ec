"""A background thread that samples device usage into the recorder every 100 ms.

On NVIDIA GPUs it reads NVML (utilisation, memory used, power, SM clock of this rank's device); elsewhere
it records this rank's process CPU usage (percent of one core) on device -1, labelled `cpu_util_pct`. Every
rank also records its resident memory (host RAM) on device -1. It never touches the pipeline's tensors.

NVML numbers GPUs its own way (by PCI bus), which is not CUDA's order under `CUDA_DEVICE_ORDER=FASTEST_FIRST`
or a `CUDA_VISIBLE_DEVICES` of UUIDs, and a MIG instance has no index at all, so the device is found by the
UUID CUDA gives it (`find_gpu`): `GPU-…`, or `MIG-…` for a MIG instance. When NVML cannot find it, the rank
records CPU counters and its metadata says why, rather than sampling a guessed GPU.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from ppscope.trace.model import Metric
from ppscope.trace.recorder import Recorder

__all__ = ["CounterSampler", "NvmlGpu", "find_gpu"]


@dataclass(frozen=True)
class NvmlGpu:
    """A device NVML found: the (initialised) pynvml module, the device's handle and its UUID."""

    nvml: Any
    handle: Any
    uuid: str
    index: int
    """The GPU's number in NVML (nvidia-smi's; of the GPU a MIG instance is part of), the counters' `device`."""


def find_gpu(uuid: str | None, ordinal: int = -1) -> tuple[NvmlGpu | None, str]:
    """NVML's handle of the device with CUDA's `uuid` (with or without its `GPU-`/`MIG-` prefix), and where
    the rank's counters come from: `nvml GPU-…`, `cpu` (no GPU), or `cpu:` and why NVML cannot be used.
    `ordinal` (CUDA's) labels the counters only when NVML cannot number the GPU."""
    if uuid is None:
        return None, "cpu"
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no driver, no pynvml
        return None, f"cpu: NVML is not available ({type(exc).__name__}: {exc})"
    bare = uuid.split("-", 1)[1] if uuid[:4] in ("GPU-", "MIG-") else uuid
    for name in (f"GPU-{bare}", f"MIG-{bare}"):
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(name.encode())
        except Exception:
            continue
        return NvmlGpu(pynvml, handle, name, _nvml_index(pynvml, handle, ordinal)), f"nvml {name}"
    with contextlib.suppress(Exception):
        pynvml.nvmlShutdown()
    return None, f"cpu: NVML has no device with UUID {uuid} (GPU-{bare} or MIG-{bare})"


def _nvml_index(nv: Any, handle: Any, ordinal: int) -> int:
    with contextlib.suppress(Exception):
        if nv.nvmlDeviceIsMigDeviceHandle(handle):
            handle = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
    try:
        return int(nv.nvmlDeviceGetIndex(handle))
    except Exception:
        return ordinal


class CounterSampler:
    """Start with `start()`, stop with `stop()`. `gpu`: this rank's GPU as NVML found it (`find_gpu`), or None
    for CPU counters."""

    def __init__(self, recorder: Recorder, gpu: NvmlGpu | None, interval_ms: float = 100.0) -> None:
        self.rec = recorder
        self.interval_s = interval_ms / 1e3
        self.gpu = gpu
        self._nvml: Any = gpu.nvml if gpu is not None else None
        self._handle: Any = gpu.handle if gpu is not None else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.source = "nvml" if gpu is not None else "cpu"

    def start(self) -> None:
        if not self.rec.enabled:
            return
        self._thread = threading.Thread(target=self._run, name=f"ppscope-sampler-r{self.rec.rank}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None

    def _run(self) -> None:
        last_wall, last_cpu = time.perf_counter(), time.process_time()
        page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        while not self._stop.wait(self.interval_s):
            if not self.rec.enabled:  # paused: sample nothing, and start the next CPU interval afresh
                last_wall, last_cpu = time.perf_counter(), time.process_time()
                continue
            if self._nvml is not None:
                self._sample_gpu()
            else:
                wall, cpu = time.perf_counter(), time.process_time()
                if wall > last_wall:
                    self.rec.counter(Metric.CPU_UTIL_PCT, 100.0 * (cpu - last_cpu) / (wall - last_wall), device=-1)
                last_wall, last_cpu = wall, cpu
            rss = _rss_pages()  # host memory on GPU ranks too: the recorder's own footprint shows there
            if rss is not None:
                self.rec.counter(Metric.RSS_BYTES, float(rss * page), device=-1)

    def _sample_gpu(self) -> None:
        nv, h, dev = self._nvml, self._handle, self.gpu.index if self.gpu is not None else -1
        readers = (
            (Metric.GPU_UTIL_PCT, lambda: float(nv.nvmlDeviceGetUtilizationRates(h).gpu)),
            (Metric.GPU_MEM_USED_BYTES, lambda: float(nv.nvmlDeviceGetMemoryInfo(h).used)),
            (Metric.GPU_POWER_W, lambda: nv.nvmlDeviceGetPowerUsage(h) / 1e3),
            (Metric.GPU_SM_CLOCK_MHZ, lambda: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))),
        )
        for metric, read in readers:
            try:
                value = read()
            except Exception:  # a metric this GPU does not report (power on some virtual GPUs): skip it alone
                continue
            self.rec.counter(metric, value, device=dev)


def _rss_pages() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
