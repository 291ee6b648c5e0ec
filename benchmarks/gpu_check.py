"""What only a CUDA device can check, in one go of a few minutes on one GPU.

    python -m benchmarks.gpu_check [--out DIR]

It prints its findings and writes them to DIR/gpu_check.md (default: the current folder):
1. the GPU-only tests (`pytest -m gpu`): CUDA-event timing, the synthetic model's GPU sleep, device-timed
   spans, the engine on `cuda` with one stage;
2. device-timed spans against a known cost: the synthetic model's forward spans ÷ its configured sleep;
3. NVML sampling in that run: which metrics were recorded, how often, and the GPU's mean utilisation;
4. the layer profile against the run: the tiny model's decode-step compute predicted by the profile (from
   cold caches, and back to back) ÷ what the one-stage run measured;
5. recording overhead on the GPU: one run with recording paused in every other window.
6. with two or more GPUs, the ring over NCCL (`benchmarks.ring_check`, up to 4 ranks): every schedule's tokens
   against one rank's, efficiency against the ideal, device-timed spans, the analyzer's warnings and the
   ranks' clock offsets;
7. with two or more GPUs, what the engine measures there (`benchmarks.gpu_path_check`, up to 4 ranks): the
   idle causes of one gpipe run on CPUs and on the GPUs, the gap between consecutive forwards while every
   stage is busy (receives overlap the compute), clock offsets on one host (0, and a ping-pong finding 0),
   causality in every run, and each rank's NVML device found by its UUID. On one GPU 6 and 7 say that they
   were not checked;
8. two ranks sharing the first GPU over gloo, activations through host memory (`benchmarks.one_gpu_check`):
   device-timed spans against the configured sleep and the wall time, NVML counters per rank, in-situ layer
   costs against the configured ones, and Llama-3-8B's decode layers against the roofline cost model.
Every figure is a ratio to a reference taken in the same run. Needs torch with CUDA, pynvml and nvtx.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from ppscope.trace.model import SpanKind

SLEEP_MS = 2.0
LAYERS = 4


def tests() -> list[str]:
    # not the test that runs this check: it would run these tests again, and itself, without end
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-m",
        "gpu",
        "-k",
        "not gpu_check",
        "-p",
        "no:cacheprovider",
        "tests/test_engine_gpu.py",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    tail = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
    lines = [f"pytest -m gpu: exit {done.returncode}: {tail}"]
    if done.returncode != 0:
        lines += ["    " + line for line in (done.stdout + done.stderr).strip().splitlines()[-40:]]
    return lines


def synthetic(tmp: Path) -> list[str]:
    from ppscope.engine.config import EngineConfig, ModelConfig, OutputConfig, PipelineConfig, WorkloadConfig
    from ppscope.engine.launch import run
    from ppscope.trace.store import load_run

    cfg = EngineConfig(
        pipeline=PipelineConfig(stages=1, schedule="serve"),
        model=ModelConfig(name="synthetic", layers=LAYERS, layer_cost_ms=(SLEEP_MS,)),
        workload=WorkloadConfig(requests=8, prompt_len=8, max_new_tokens=32),
        output=OutputConfig(progress=False, out=tmp / "synthetic"),
    )
    trace = load_run(run(cfg))
    fwd = trace.spans[trace.spans["kind"] == SpanKind.FORWARD]
    took = ((fwd["end_ns"] - fwd["start_ns"]) / 1e6).to_numpy()
    want = LAYERS * SLEEP_MS
    lines = [
        f"device-timed forward spans, synthetic {LAYERS} x {SLEEP_MS:g} ms on {trace.meta.ranks[0].device}: "
        f"median ÷ configured = {statistics.median(took) / want:.3f} (min {took.min() / want:.3f}, "
        f"max {took.max() / want:.3f}, {len(took)} spans)"
    ]
    counters = trace.counters
    if counters.empty:
        return [*lines, "NVML: no counters recorded"]
    window_s = (counters["ts_ns"].max() - counters["ts_ns"].min()) / 1e9 or 1.0
    rates = counters.groupby("metric").size() / window_s
    util = counters[counters["metric"] == "gpu_util_pct"]["value"]
    per_metric = ", ".join(f"{m} {r:.1f}/s" for m, r in rates.items())
    mean_util = f"{util.mean():.0f}%" if len(util) else "none"
    return [*lines, f"counters sampled over {window_s:.1f} s: {per_metric}; mean GPU utilisation {mean_util}"]


def _ring(tmp: Path, gpus: int) -> list[str]:
    if gpus < 2:
        return [f"ring over NCCL: not checked: it needs two or more GPUs and this machine has {gpus}"]
    from benchmarks.ring_check import ring_checks

    return ring_checks(tmp, "nccl", min(gpus, 4))


def _gpu_path(tmp: Path, gpus: int) -> list[str]:
    if gpus < 2:
        return [f"GPU path over NCCL: not checked: it needs two or more GPUs and this machine has {gpus}"]
    from benchmarks.gpu_path_check import gpu_path_checks

    return gpu_path_checks(tmp, "nccl", min(gpus, 4))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".", help="folder for gpu_check.md (default: the current folder)")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_check: error: torch is not installed: install torch with CUDA first", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_check: error: no CUDA device here: run this on a machine with an NVIDIA GPU", file=sys.stderr)
        return 2
    from benchmarks.bench_engine import overhead_alternating
    from benchmarks.bench_tune import profile_vs_run
    from benchmarks.one_gpu_check import one_gpu_checks

    report = [f"# GPU checks on {torch.cuda.get_device_name(0)} (torch {torch.__version__})", ""]
    with tempfile.TemporaryDirectory() as tmp:
        checks: list[tuple[str, Callable[[], Sequence[object]]]] = [  # lines, or Figures
            ("tests", tests),
            ("synthetic", lambda: synthetic(Path(tmp))),
            ("profile", lambda: profile_vs_run(Path(tmp), stages=1, device="cuda")),
            ("overhead", lambda: [overhead_alternating(Path(tmp), stages=1)]),
            ("ring", lambda: _ring(Path(tmp), torch.cuda.device_count())),
            ("gpu path", lambda: _gpu_path(Path(tmp), torch.cuda.device_count())),
            ("one gpu", lambda: one_gpu_checks(Path(tmp))),
        ]
        for name, check in checks:
            try:
                lines = [str(line) for line in check()]
            except Exception as exc:  # one failed check must not hide the others' findings
                lines = [f"{name}: failed: {type(exc).__name__}: {exc}"]
            print("\n".join(lines), flush=True)
            report += [f"- {line}" if not line.startswith("    ") else line for line in lines]
    out = Path(args.out) / "gpu_check.md"
    out.write_text("\n".join(report) + "\n")
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
