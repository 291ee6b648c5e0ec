"""Checks only a CUDA device can run; they skip cleanly on CPU-only machines (CI, laptops)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)"),
]


def test_synthetic_layer_sleeps_its_time_on_the_gpu() -> None:
    from engine.model import sleep_ms

    device = torch.device("cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    sleep_ms(2.0, device)
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 1.8  # the spin kernel keeps the GPU busy at least that long


def test_profile_times_layers_with_cuda_events() -> None:
    from engine.config import EngineConfig
    from engine.profile import profile_layers

    prof = profile_layers(EngineConfig(model="tiny", prompt_len=8, progress=False), warmup=1, repeats=3, device="cuda")
    assert prof.method == "cuda-events" and prof.device != "cpu"
    assert len(prof.decode.layer_ms) == 8 and all(t > 0 for t in prof.decode.layer_ms)
