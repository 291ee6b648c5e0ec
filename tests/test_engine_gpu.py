"""Checks only a CUDA device can run; they skip cleanly on CPU-only machines (CI, laptops)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)"),
]


def test_synthetic_layer_sleeps_its_time_on_the_gpu() -> None:
    from ppscope.engine.model import sleep_ms

    device = torch.device("cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    sleep_ms(2.0, device)
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 1.8  # the spin kernel keeps the GPU busy at least that long


def test_profile_times_layers_with_cuda_events() -> None:
    from ppscope.engine.config import EngineConfig, OutputConfig, WorkloadConfig
    from ppscope.engine.profiler import profile_layers

    cfg = EngineConfig(workload=WorkloadConfig(prompt_len=8), output=OutputConfig(progress=False))
    prof = profile_layers(cfg, warmup=1, repeats=3, device="cuda")
    assert prof.method == "cuda-events" and prof.device != "cpu"
    assert len(prof.decode.layer_ms) == 8 and all(t > 0 for t in prof.decode.layer_ms)


def test_device_spans_time_gpu_work_with_cuda_events() -> None:
    from ppscope.engine.gputime import DeviceSpans
    from ppscope.engine.model import sleep_ms
    from ppscope.trace.recorder import Recorder

    device = torch.device("cuda")
    rec = Recorder(None, rank=0, stage=0, nvtx=False)
    stream = torch.cuda.current_stream(device)
    dev = DeviceSpans(rec, stream, lambda: torch.cuda.Event(enable_timing=True))
    sleep_ms(0.1, device)  # the first sleep calibrates the spin (100 ms and more): not one of the launches timed
    torch.cuda.synchronize(device)
    launched = rec.now_ns()
    for mb in range(3):
        with dev.span("forward", mb=mb):
            sleep_ms(5.0, device)
    host_ms = (rec.now_ns() - launched) / 1e6
    dev.close()
    spans = rec.frame().sort_values("start_ns")
    took = ((spans["end_ns"] - spans["start_ns"]) / 1e6).tolist()
    assert host_ms < 5.0  # the launches returned before the work ran
    assert all(4.5 < t < 6.5 for t in took), took
    gaps = (spans["start_ns"].to_numpy()[1:] - spans["end_ns"].to_numpy()[:-1]) / 1e6
    assert (gaps < 0.5).all() and (gaps > -0.01).all()  # back to back on the stream, in order
    assert spans["start_ns"].iloc[0] >= launched - dev.anchor.uncertainty_ns


def test_engine_runs_one_stage_on_the_gpu_with_device_timed_spans(tmp_path: Path) -> None:
    from ppscope.engine.config import EngineConfig, OutputConfig, PipelineConfig, WorkloadConfig
    from ppscope.engine.launch import run
    from ppscope.trace.store import load_run, read_requests

    out = tmp_path / "run"
    run(
        EngineConfig(
            pipeline=PipelineConfig(stages=1, schedule="serve"),
            workload=WorkloadConfig(requests=4, prompt_len=8, max_new_tokens=8),
            output=OutputConfig(progress=False, out=out),
        )
    )
    trace = load_run(out)
    assert trace.meta.backend in ("nccl", "gloo") and trace.meta.ranks[0].device != "cpu"
    kinds = set(trace.spans["kind"].astype(str))
    assert {"embed", "forward", "head", "sample"} <= kinds
    fwd = trace.spans[trace.spans["kind"] == "forward"]
    assert ((fwd["end_ns"] - fwd["start_ns"]) > 0).all()
    assert read_requests(out)["output_len"].tolist() == [8, 8, 8, 8]


def test_two_ranks_share_one_gpu_over_gloo_and_sample_what_the_cpu_samples(tmp_path: Path) -> None:
    """`--backend gloo --device cuda`: both ranks on the one GPU, activations through host memory; the run
    says so (gloo, the GPU's name on each rank, device cuda in its config), its spans are device-timed and a
    receive moves each activation onto the GPU, and greedy tokens equal those of one rank on the same GPU."""
    from ppscope.engine.config import EngineConfig, OutputConfig, PipelineConfig, RuntimeConfig, WorkloadConfig
    from ppscope.engine.launch import run
    from ppscope.trace.store import load_run, read_requests

    outputs = {}
    for stages in (2, 1):
        out = tmp_path / str(stages)
        run(
            EngineConfig(
                pipeline=PipelineConfig(stages=stages, schedule="gpipe"),
                workload=WorkloadConfig(requests=4, prompt_len=8, max_new_tokens=8),
                output=OutputConfig(progress=False, out=out),
                runtime=RuntimeConfig(backend="gloo", device="cuda"),
            )
        )
        outputs[stages] = read_requests(out).sort_values("id")["output_ids"].tolist()
    trace = load_run(tmp_path / "2")
    assert trace.meta.backend == "gloo" and trace.meta.config["device"] == "cuda"
    assert all(info.device not in ("", "cpu") for info in trace.meta.ranks)
    kinds = set(trace.spans["kind"].astype(str))
    assert {"forward", "send", "recv_wait"} <= kinds and "recv" not in kinds  # the stream's waits: device-timed
    assert outputs[2] == outputs[1]


def test_gpu_check_runs_every_check_and_writes_its_report(tmp_path: Path) -> None:
    from benchmarks.gpu_check import main

    assert main(["--out", str(tmp_path)]) == 0
    report = (tmp_path / "gpu_check.md").read_text()
    assert "pytest -m gpu: exit 0" in report and "failed:" not in report, report
    assert "gpu_util_pct" in report and "cold caches" in report and "throughput on/off" in report
    assert "one GPU: in-situ layer costs" in report and "÷ the roofline" in report


def test_cuda_draws_equal_cpu_draws_without_copying_to_the_host() -> None:
    from ppscope.engine.sampling import Sampling, row_keys, sample

    logits = torch.randn(4, 32000, generator=torch.Generator().manual_seed(1))
    cfg, keys = Sampling(temperature=0.8, top_p=0.95), row_keys(3, [0, 1, 2, 3], [17, 17, 40, 2])
    on_gpu = sample(logits.cuda(), cfg, keys)
    assert on_gpu.is_cuda
    assert on_gpu.cpu().tolist() == sample(logits, cfg, keys).tolist()


def test_a_pass_index_on_the_gpu_equals_the_host_one() -> None:
    from ppscope.balance.modelled.shapes import ModelShape
    from ppscope.engine.model import Batch, Rotary

    shape = ModelShape.from_name("tiny")
    batch = Batch([2, 0], [0, 9], [5, 1], [4, 1])
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    host = batch.index(cpu, Rotary(shape, cpu), torch.float32)
    dev = batch.index(gpu, Rotary(shape, gpu), torch.float32)
    for name in ("seq", "t", "pos", "slots", "mask"):
        assert torch.equal(getattr(dev, name).cpu(), getattr(host, name)), name
    assert torch.allclose(dev.cos.cpu(), host.cos) and torch.allclose(dev.sin.cpu(), host.sin)
