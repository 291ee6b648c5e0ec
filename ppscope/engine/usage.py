"""A background thread that samples device usage into the recorder every 100 ms.

On NVIDIA GPUs it reads NVML (utilisation, memory used, power, SM clock of this rank's device); elsewhere
it records this rank's process CPU usage (percent of one core) on device -1, labelled `cpu_util_pct`. Every
rank also records its resident memory (host RAM) on device -1. It never touches the pipeline's tensors.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any

from ppscope.trace.model import Metric
from ppscope.trace.recorder import Recorder

__all__ = ["CounterSampler"]


class CounterSampler:
    """Start with `start()`, stop with `stop()`. `gpu_index` is the NVML index of this rank's GPU, or None."""

    def __init__(self, recorder: Recorder, gpu_index: int | None, interval_ms: float = 100.0) -> None:
        self.rec = recorder
        self.interval_s = interval_ms / 1e3
        self.gpu_index = gpu_index
        self._nvml: Any = None
        self._handle: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.source = "cpu"
        if gpu_index is not None:
            try:
                import pynvml

                pynvml.nvmlInit()
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(gpu_index)
                self._nvml = pynvml
                self.source = "nvml"
            except Exception:  # no driver / no NVIDIA GPU: fall back to CPU counters, labelled as such
                self._nvml = None

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
        nv, h, dev = self._nvml, self._handle, int(self.gpu_index or 0)
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
