"""The cost model on the command line: its options, and the lines it adds to `rebalance` and `plan`.

`ppscope rebalance --model M --stages P --gpu G` times every part of the model from its shape and the GPU's
datasheet (at the shares of its peaks kernels were measured to reach, or at the peaks with --peak), and
`ppscope rebalance TRACE --model M` (an nsys or Kineto trace, which records no split) calibrates the same costs
on the trace's stage busy times first: both are `ppscope.balance.report.rebalance_model`.
`ppscope plan --gpu G` prints the modelled step time of each stage. This module prints only the lines the cost
model adds.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ppscope.balance.modelled.plan import StepTimes
    from ppscope.balance.report import ModelSection
    from ppscope.cli.argtypes import Options


__all__ = [
    "add_workload_arguments",
    "print_assumptions",
    "print_model_lines",
    "print_step_times",
    "wants_model",
]


def add_workload_arguments(group: Options, *, default_gpu_note: str) -> None:
    """--gpu, --batch and --context: the GPU and the pass the cost model times."""
    from ppscope.balance.modelled.gpus import GPUS

    group.add_argument(
        "--gpu", help=f"GPU type timing the model from its datasheet: {', '.join(GPUS)}{default_gpu_note}"
    )
    group.add_argument("--batch", type=int, default=16, help="the modelled pass: sequences per micro-batch (16)")
    group.add_argument(
        "--context",
        type=int,
        default=2048,
        help="the modelled pass: tokens per sequence, in the KV cache (decode) or the prompt (prefill) (2048)",
    )
    group.add_argument(
        "--peak",
        action="store_true",
        help="time at the datasheet's peaks, not the shares of them kernels were measured to reach on the GPU's "
        "family (the default; printed with their sources in the assumptions)",
    )


def wants_model(args: argparse.Namespace) -> bool:
    """Whether `ppscope rebalance` takes its costs from the cost model: --model without costs given, and
    either no run or a trace of another engine."""
    from ppscope.formats.detect import InputKind, detect

    given = bool(args.layer_costs or args.layers or args.layer_cost_ms is not None)
    if given or not args.model:
        return False
    return not args.runs or detect(Path(args.runs[-1])).kind != InputKind.RUN


def print_model_lines(model: ModelSection, where: str) -> None:
    """The lines the cost model adds before the usual advice: where the costs come from."""
    m, cal, w = model.costs, model.calibration, model.costs.workload
    mean_layer = sum(p.ms for p in m.layers) / len(m.layers)
    if cal is None:
        print(
            f"costs: modelled from {m.shape.name} on {m.gpu.name}, no run: {w.phase}, {w.batch} "
            f"sequence(s) x {w.context} tokens, {w.dtype}, TP {w.tp}"
        )
    else:
        print(
            f"costs: {m.shape.name}'s modelled shape calibrated on {where}: ×{cal.scale:.4g} trace ms per modelled "
            f"ms, fixed overhead per stage {', '.join(f'{o:.3f}' for o in cal.overhead_ms)} ms; stage times are "
            "busy ms over the trace's window"
        )
    first, last = m.layers[0], m.layers[-1]
    kinds = [first] if first.ms == last.ms else [first, last]
    for part, name in zip(kinds, ("layer 0", f"layer {len(m.layers) - 1}"), strict=False):
        print(
            f"  modelled {name}: {part.weight_bytes / 2**30:.3f} GiB weights + {part.kv_bytes / 2**30:.3f} GiB KV, "
            f"{part.flops / 1e12:.3f} TFLOP -> {part.ms:.3f} ms ({part.bound}-bound"
            + (f", {part.comm_ms:.3f} ms all-reduce" if part.comm_ms else "")
            + ")"
        )
    print(
        f"  modelled LM head {m.head.ms:.3f} ms = {m.head.ms / mean_layer:.2f} mean layers; sampling "
        f"{m.sample.ms:.4f} ms; embedding {m.embed.ms:.4f} ms"
    )
    for warning in model.warnings:
        print(f"warning: {warning}")


def print_assumptions(model: ModelSection) -> None:
    print("Assumptions:")
    for a in model.assumptions:
        print(f"  - {a}")


def print_step_times(steps: StepTimes, fix_split: Sequence[int] | None) -> None:
    now = steps.stage_ms
    slowest = max(now)
    w = steps.costs.workload
    print(
        f"decode step on {steps.costs.gpu.name} ({w.batch} sequence(s) x {w.context} tokens of context), per stage: "
        f"{', '.join(f'{t:.3f}' for t in now)} ms; the slowest, stage {now.index(slowest)}, paces the pipeline "
        f"at {1e3 / slowest:.0f} micro-batch steps/s"
        + (
            f"; with split {','.join(map(str, fix_split))}: {max(steps.fix_stage_ms):.3f} ms"
            if steps.fix_stage_ms and fix_split
            else ""
        )
    )
    from ppscope.balance.modelled.roofline import rate_lines

    rates = rate_lines(steps.costs.gpu, w.dtype)
    print(f"  (the cost model: {rates[1]}; {rates[2]})")
