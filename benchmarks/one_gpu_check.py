"""What the engine measures with its ranks on one GPU, gloo carrying activations through host memory
(`--backend gloo --device cuda`): the checks a machine with a single GPU can make (`benchmarks.gpu_check`
runs them there; on CPUs, `device="cpu"`, the same code runs on host-timed spans, which is how this check
itself is tested):

1. spans against wall time: each rank's device-timed `forward` spans of the synthetic model ÷ its
   configured sleep, and the spans' extent on the common clock ÷ the run's wall time from its request log
   (device spans that drift off the host clock show here);
2. NVML: every rank's counters come from the GPU NVML finds by its device UUID (one GPU: the same for all);
3. in-situ layer costs: each layer's `layer` spans (every pass timed) ÷ its configured cost, on layers of
   different costs;
4. the cost model: a real model's decode `layer` spans on this GPU ÷ the roofline's per-layer decode time
   for the same batch and context (`ppscope.balance.modelled.roofline`): how far eager PyTorch is from the datasheet.

Every figure is a ratio to a reference taken in the same run; nothing is asserted here.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from ppscope.trace.model import SpanKind, Trace

__all__ = ["gpu_entry", "one_gpu_checks"]

LAYER_MS = (1.0, 2.0, 3.0, 4.0)
"""The synthetic model's layers: different costs, so a layer's spans cannot pass for another's."""


def one_gpu_checks(
    tmp: Path, device: str = "cuda", *, model: str = "llama3-8b", dtype: str = "bfloat16", gpu: str | None = None
) -> list[str]:
    """One line per finding. `model`/`dtype`: the real model of check 4; `gpu`: its datasheet entry (default:
    from the device's name)."""
    synthetic = _run(
        tmp / "synthetic", device, model="synthetic", layers=len(LAYER_MS), layer_cost_ms=LAYER_MS, max_new_tokens=24
    )
    lines = [*_spans_vs_wall(synthetic), *_nvml(synthetic), *_layers_vs_configured(synthetic)]
    real = _run(tmp / "real", device, model=model, dtype=dtype, max_new_tokens=32, prompt_len=128)
    return [*lines, *_layers_vs_roofline(real, gpu or real.meta.ranks[0].device)]


def _run(out: Path, device: str, *, max_new_tokens: int, prompt_len: int = 8, **model: Any) -> Trace:
    from ppscope.engine.config import (
        EngineConfig,
        ModelConfig,
        OutputConfig,
        PipelineConfig,
        RuntimeConfig,
        WorkloadConfig,
    )
    from ppscope.engine.launch import run
    from ppscope.trace.store import load_run

    cfg = EngineConfig(
        pipeline=PipelineConfig(stages=2, schedule="serve", max_inflight=2, max_batch=8),
        model=ModelConfig(name=model.pop("model"), **model),
        workload=WorkloadConfig(requests=16, prompt_len=prompt_len, max_new_tokens=max_new_tokens),
        output=OutputConfig(progress=False, out=out, layer_spans=1),
        runtime=RuntimeConfig(backend="gloo", device=device),
    )
    return load_run(run(cfg))


def _ms(spans: Any) -> Any:
    return (spans["end_ns"] - spans["start_ns"]) / 1e6


def _spans_vs_wall(trace: Trace) -> list[str]:
    spans = trace.spans
    lines = []
    for rank, mine in spans[spans["kind"] == SpanKind.FORWARD].groupby("rank"):
        want = sum(LAYER_MS[i] for i in range(len(LAYER_MS)) if _stage_of_layer(trace, i) == rank)
        took = _ms(mine)
        lines.append(
            f"one GPU, rank {rank} of 2 over gloo ({trace.meta.ranks[0].device}): forward spans ÷ configured "
            f"{want:g} ms = {statistics.median(took) / want:.3f} (min {took.min() / want:.3f}, max "
            f"{took.max() / want:.3f}, {len(took)} spans)"
        )
    requests = trace.requests
    if len(requests):
        wall = (requests["finish_ns"].max() - requests["arrival_ns"].min()) / 1e9
        extent = (spans["end_ns"].max() - spans["start_ns"].min()) / 1e9
        lines.append(
            f"one GPU: extent of the spans on the common clock ÷ the requests' wall time = "
            f"{extent / wall:.3f} ({extent:.3f} s ÷ {wall:.3f} s)"
        )
    return lines


def _stage_of_layer(trace: Trace, layer: int) -> int:
    from ppscope.balance.split import stage_layer_ranges

    return next(s for s, (first, end) in enumerate(stage_layer_ranges(trace.meta.split)) if first <= layer < end)


def _nvml(trace: Trace) -> list[str]:
    counters = trace.counters
    uuids = {info.rank: info.counters for info in trace.meta.ranks}
    if counters.empty:
        return [f"one GPU: no usage counters recorded (the ranks' counter sources: {uuids})"]
    per_rank = counters.groupby("rank")["metric"].nunique().to_dict()
    return [f"one GPU: usage metrics recorded per rank {per_rank}; the ranks' counter sources {uuids}"]


def _layers_vs_configured(trace: Trace) -> list[str]:
    from ppscope.balance.measured.insitu import insitu_costs

    found = insitu_costs([trace])
    ratios = ", ".join(f"{got / want:.3f}" for got, want in zip(found.costs.layer_ms, LAYER_MS, strict=True))
    return [
        f"one GPU: in-situ layer costs ({found.phase} passes, {min(found.passes)}+ spans each) ÷ configured "
        f"{', '.join(f'{c:g}' for c in LAYER_MS)} ms = {ratios}"
    ]


def gpu_entry(device_name: str) -> Any:
    """The datasheet entry of a device called `device_name` by CUDA (`NVIDIA H200`, `NVIDIA A100-SXM4-40GB`):
    the known name all of whose parts it contains, the longest such; else the family's default part
    (`NVIDIA H100 80GB HBM3`: `h100`, the SXM one); None when nothing fits."""
    from ppscope.balance.modelled.gpus import GPUS, gpu_named
    from ppscope.errors import InvalidConfigError

    words = device_name.lower().replace("nvidia", " ").replace("-", " ").split()
    fits = [name for name in GPUS if all(any(w.startswith(part) for w in words) for part in name.split("-"))]
    if fits:
        return GPUS[max(fits, key=len)]
    for word in words:
        try:
            return gpu_named(word)
        except InvalidConfigError:
            continue
    return None


def _layers_vs_roofline(trace: Trace, gpu_name: str) -> list[str]:
    from ppscope.balance.modelled.roofline import Workload, model_costs
    from ppscope.balance.modelled.shapes import PRESETS

    gpu = gpu_entry(gpu_name)
    if gpu is None:  # a GPU the datasheet table does not have
        return [f"one GPU: cost model not checked: no datasheet entry for {gpu_name!r}"]
    spans = trace.spans
    layers = spans[(spans["kind"] == SpanKind.LAYER) & (spans["phase"] == "decode")]
    if layers.empty:
        return ["one GPU: cost model not checked: the run has no decode `layer` spans"]
    requests = trace.requests
    context = int(requests["prompt_len"].mean() + requests["output_len"].mean() / 2) if len(requests) else 1
    batch = int(layers["tokens"].median())
    shape = PRESETS[trace.meta.model.get("source", trace.meta.model.get("name", ""))]
    dtype = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(trace.meta.config.get("dtype", ""), "bf16")
    costs = model_costs(shape, gpu, Workload(phase="decode", batch=batch, context=context, dtype=dtype))
    predicted = statistics.median(part.ms for part in costs.layers)
    measured = float(statistics.median(_ms(layers)))
    return [
        f"one GPU: {shape.name} decode layer, batch {batch}, context ~{context}, {dtype}: measured median "
        f"{measured:.3f} ms ÷ the roofline's {predicted:.3f} ms on {gpu.name} = {measured / predicted:.2f} "
        f"({len(layers)} layer spans)"
    ]
