"""The cost model on the command line: advice with no run, advice from another engine's trace, step times.

`ppscope rebalance --model M --stages P --gpu G` times every part of the model from its shape and the GPU's
datasheet (`ppscope.balance.modelled.roofline`) and balances those costs; `ppscope rebalance TRACE --model M` (an nsys
or Kineto trace, which records no split) calibrates the same costs on the trace's stage busy times
(`ppscope.balance.modelled.tracefit`) first; `ppscope plan --gpu G` prints the modelled step time of each stage.
The commands print what these functions return; this module prints only the lines the cost model adds.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ppscope.trace.notices import Notice

__all__ = [
    "DEFAULT_GPU",
    "add_workload_arguments",
    "advise_from_model",
    "plan_step_times",
    "print_assumptions",
    "print_model_lines",
    "print_step_times",
    "wants_model",
]

DEFAULT_GPU = "h100-sxm"
"""The GPU a trace is calibrated with when --gpu is not given: calibration keeps only the model's shape."""


def add_workload_arguments(group: Any, *, default_gpu_note: str) -> None:
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


def wants_model(args: argparse.Namespace) -> bool:
    """Whether `ppscope rebalance` takes its costs from the cost model: --model without costs given, and
    either no run or a trace of another engine."""
    from ppscope.formats.detect import InputKind, detect

    given = bool(args.layer_costs or args.layers or args.layer_cost_ms is not None)
    if given or not args.model:
        return False
    return not args.runs or detect(Path(args.runs[-1])).kind != InputKind.RUN


def _per_stage(text: str, what: str, stages: int) -> list[float]:
    from ppscope.balance.costs import parse_ms_list
    from ppscope.errors import InvalidConfigError

    values = parse_ms_list(text, what)
    if len(values) not in (1, stages):
        raise InvalidConfigError(f"{what} gives {len(values)} values for {stages} stages: give one, or one per stage")
    return values * stages if len(values) == 1 else values


def _measured(path: str) -> tuple[list[float], Any]:
    """Busy ms of each stage of the trace at `path`, as `ppscope analyze` measures it, and the analysis."""
    from ppscope.analysis import analyze
    from ppscope.formats.sources import open_trace

    result = analyze(open_trace(path))
    return [s.busy_ns / 1e6 for s in result.stages], result


def _memory(args: argparse.Namespace, shape: Any, stages: int, dtype: str) -> Any:
    from ppscope.balance.modelled.plan import stage_memory_model

    if not args.gpu_mem_gib:
        return None
    return stage_memory_model(
        shape,
        _per_stage(args.gpu_mem_gib, "--gpu-mem-gib", stages),
        gpu_memory_utilization=args.gpu_memory_utilization,
        dtype=dtype,
        tp=args.tp,
        reserve_gib=args.reserve_gib,
        min_kv_tokens=args.min_kv_tokens,
    )


def _weights_warnings(shape: Any, gpu: Any, split: list[int], dtype: str, tp: int) -> list[Notice]:
    """Stages whose weights alone exceed the GPU's memory."""
    from ppscope.balance.modelled.shapes import dtype_bytes
    from ppscope.balance.split import stage_layer_ranges
    from ppscope.trace.notices import Notice, NoticeCode

    out, last = [], len(split) - 1
    for s, (i, j) in enumerate(stage_layer_ranges(split)):
        params = sum(shape.layer_params_at(k) for k in range(i, j))
        params += (shape.embed_params if s == 0 else 0) + (shape.head_params if s == last else 0)
        gb = params * dtype_bytes(dtype) / tp / 1e9
        if gb > gpu.memory_gb:
            text = (
                f"stage {s}'s weights ({gb:.0f} GB per GPU in {dtype}) exceed a {gpu.name}'s {gpu.memory_gb:g} GB: "
                "use more stages, a larger --tp or --dtype fp8 (ppscope plan sizes memory)"
            )
            out.append(Notice(NoticeCode.WEIGHTS_EXCEED_GPU, text))
    return out


@dataclass(frozen=True, kw_only=True)
class _Costs:
    """What a cost path hands the rebalancer, and what it tells the reader."""

    costs: Any
    """LayerCosts, ms per pass (modelled) or trace ms (calibrated)."""
    stage_costs: Any
    """StageCosts: the options', or the calibration's overheads."""
    stages: int
    current: list[int] | None
    """The split to compare with; None: vLLM's rule."""
    calibration: Any = None
    measured_ms: list[float] | None = None
    assumptions: tuple[str, ...] = ()


def advise_from_model(args: argparse.Namespace, shape: Any) -> tuple[dict[str, Any], Any, Any]:
    """`ppscope rebalance`'s answer from the cost model: with no run, or calibrated on a trace's stage times.
    The keys of the usual answer, plus `model_costs`, `calibration`, `assumptions` and `warnings`; with the
    BalanceProblem and the Rebalance they come from."""
    from ppscope.balance.advise.problem import BalanceProblem
    from ppscope.balance.advise.rebalance import rebalance
    from ppscope.balance.modelled.gpus import gpu_named
    from ppscope.balance.modelled.roofline import Workload, model_costs
    from ppscope.errors import InvalidConfigError

    if len(args.runs) > 1:
        raise InvalidConfigError("give one trace of another engine to calibrate the model on, not several")
    if args.phase == "all":
        raise InvalidConfigError("the cost model times one phase: give --phase decode or --phase prefill")
    if not args.runs and not args.gpu:
        raise InvalidConfigError(
            f"give --gpu NAME to time {shape.name} without a run (known GPUs: {_gpu_names()}), or --layer-costs"
        )
    dtype = args.dtype or "bf16"
    gpu = gpu_named(args.gpu or DEFAULT_GPU)
    work = Workload(phase=args.phase or "decode", batch=args.batch, context=args.context, dtype=dtype, tp=args.tp)
    modelled = model_costs(shape, gpu, work)
    got = _from_trace(args, shape, modelled) if args.runs else _without_run(args, shape, modelled)
    problem = BalanceProblem(
        costs=got.costs,
        stages=got.stages,
        stage_costs=got.stage_costs,
        memory=_memory(args, shape, got.stages, dtype),
        objective=args.objective,
    )
    advice = rebalance(problem, got.current)
    out = advice.to_dict()
    c = got.costs
    out.update(
        costs={"layer_ms": list(c.layer_ms), "embed_ms": c.embed_ms, "head_ms": c.head_ms, "sample_ms": c.sample_ms},
        kv_bytes_per_token=[n * shape.kv_bytes_per_token_per_layer(dtype) for n in advice.proposed.split],
        fit=None,
        cost_source="model" if got.calibration is None else "trace",
        measured_stage_ms=got.measured_ms,
        model_costs=modelled.to_dict(),
        calibration=None if got.calibration is None else got.calibration.to_dict(),
        assumptions=[*got.assumptions, *modelled.assumptions()],
        warnings=[w.to_json() for w in _warnings(args, shape, gpu, list(advice.current.split), got.calibration)],
    )
    return out, problem, advice


def _without_run(args: argparse.Namespace, shape: Any, modelled: Any) -> _Costs:
    """The modelled costs as they are, with the options' per-stage terms."""
    from ppscope.balance.costs import StageCosts
    from ppscope.balance.split import parse_split
    from ppscope.errors import InvalidConfigError

    if args.stages is None:
        raise InvalidConfigError(f"give --stages P: how many pipeline stages to split {shape.name}'s layers over")
    stages = args.stages
    return _Costs(
        costs=modelled.layer_costs(),
        stage_costs=StageCosts(
            overhead_ms=_per_stage(args.overhead_ms, "--overhead-ms", stages),
            comm_ms=_per_stage(args.comm_ms, "--comm-ms", stages),
            speed=_per_stage(args.speeds, "--speeds", stages),
        ),
        stages=stages,
        current=parse_split(args.current_split, shape.layers, stages) if args.current_split else None,
    )


def _from_trace(args: argparse.Namespace, shape: Any, modelled: Any) -> _Costs:
    """The modelled costs calibrated on the trace's stage busy times, for the split it ran."""
    from ppscope.balance.costs import StageCosts
    from ppscope.balance.modelled.tracefit import calibrate
    from ppscope.balance.split import parse_split, vllm_default_split
    from ppscope.errors import InvalidConfigError

    measured, result = _measured(args.runs[-1])
    stages = len(measured)
    if args.stages is not None and args.stages != stages:
        raise InvalidConfigError(f"--stages {args.stages} differs from the trace's {stages} stages")
    if args.overhead_ms != "0" or args.speeds != "1":
        raise InvalidConfigError(
            "--overhead-ms and --speeds are set by the calibration on the trace: leave them out with a trace"
        )
    if args.current_split:
        ran = parse_split(args.current_split, shape.layers, stages)
    else:
        ran = vllm_default_split(shape.layers, stages)
    calibration = calibrate(modelled.layer_costs(), ran, measured)
    comm = _per_stage(args.comm_ms, "--comm-ms", stages)
    return _Costs(
        costs=calibration.costs,
        stage_costs=StageCosts(overhead_ms=list(calibration.overhead_ms), comm_ms=comm),
        stages=stages,
        current=ran,
        calibration=calibration,
        measured_ms=measured,
        assumptions=tuple(_trace_assumptions(args, result, ran, modelled.gpu.name)),
    )


def _warnings(args: argparse.Namespace, shape: Any, gpu: Any, split: list[int], calibration: Any) -> list[Notice]:
    """Stages whose weights exceed the GPU (with --gpu), and stages the calibrated model explains poorly."""
    from ppscope.balance.split import format_split
    from ppscope.trace.notices import Notice, NoticeCode

    out = _weights_warnings(shape, gpu, split, args.dtype or "bf16", args.tp) if args.gpu else []
    if calibration is not None:
        out += [
            Notice(
                NoticeCode.POORLY_EXPLAINED,
                f"the model explains stage {s} poorly: {calibration.overhead_ms[s] / calibration.measured_ms[s]:.0%} "
                f"of its measured time is left to its fixed overhead (check --model, --current-split "
                f"{format_split(calibration.split)} and --phase)",
            )
            for s in calibration.poorly_explained()
        ]
    return out


def _gpu_names() -> str:
    from ppscope.balance.modelled.gpus import GPUS

    return ", ".join(GPUS)


def _trace_assumptions(args: argparse.Namespace, result: Any, current: list[int], gpu: str) -> list[str]:
    from ppscope.balance.split import format_split

    ranks = "; ".join(f"stage {s.stage}: rank(s) {', '.join(map(str, s.ranks))}" for s in result.stages)
    return [
        f"the trace's stages are the pipeline's, in order, as the analyzer numbers them ({ranks})",
        "each stage's time is its busy time (the union of its compute kernels) over the analysed window "
        f"({result.window.length_ns / 1e6:.1f} ms, {result.window.how.rstrip('.')}): every stage runs the same "
        "passes, so the times compare as per-pass times do",
        f"the trace ran the split {format_split(current)}"
        + (" (given)" if args.current_split else " (vLLM's default rule; give --current-split if it ran another)"),
        f"its passes are {args.phase or 'decode'} passes, shaped as below; the model's shape is calibrated with "
        "one scale for every part (the smallest measured ÷ modelled ratio over stages) plus a fixed overhead per "
        "stage (the rest of its time), which stays with the stage whatever layers it holds",
        f"the shape is timed on a {gpu}"
        + ("" if args.gpu else " (no --gpu given: after calibration only the shape matters)"),
    ]


def print_model_lines(d: dict[str, Any], where: str) -> None:
    """The lines the cost model adds before the usual advice: where the costs come from."""
    m, cal = d["model_costs"], d["calibration"]
    mean_layer = sum(p["ms"] for p in m["layers"]) / len(m["layers"])
    if cal is None:
        print(
            f"costs: modelled from {m['model']} on {m['gpu']['name']}, no run: {m['phase']}, {m['batch']} "
            f"sequence(s) x {m['context']} tokens, {m['dtype']}, TP {m['tp']}"
        )
    else:
        print(
            f"costs: {m['model']}'s modelled shape calibrated on {where}: ×{cal['scale']:.4g} trace ms per modelled "
            f"ms, fixed overhead per stage {', '.join(f'{o:.3f}' for o in cal['overhead_ms'])} ms; stage times are "
            "busy ms over the trace's window"
        )
    first, last = m["layers"][0], m["layers"][-1]
    kinds = [first] if first["ms"] == last["ms"] else [first, last]
    for part, name in zip(kinds, ("layer 0", f"layer {len(m['layers']) - 1}"), strict=False):
        print(
            f"  modelled {name}: {part['weight_bytes'] / 1e9:.3f} GB weights + {part['kv_bytes'] / 1e9:.3f} GB KV, "
            f"{part['flops'] / 1e12:.3f} TFLOP -> {part['ms']:.3f} ms ({part['bound']}-bound"
            + (f", {part['comm_ms']:.3f} ms all-reduce" if part["comm_ms"] else "")
            + ")"
        )
    print(
        f"  modelled LM head {m['head']['ms']:.3f} ms = {m['head']['ms'] / mean_layer:.2f} mean layers; sampling "
        f"{m['sample']['ms']:.4f} ms; embedding {m['embed']['ms']:.4f} ms"
    )
    for w in d["warnings"]:
        print(f"warning: {w['text']}")


def print_assumptions(d: dict[str, Any]) -> None:
    print("Assumptions:")
    for a in d["assumptions"]:
        print(f"  - {a}")


def plan_step_times(args: argparse.Namespace, shape: Any, plan: dict[str, Any]) -> dict[str, Any]:
    """The modelled step time of each stage of the plan's split (and of its fix), ms, for `ppscope plan --gpu`."""
    from ppscope.balance.advise.problem import BalanceProblem
    from ppscope.balance.advise.rebalance import evaluate
    from ppscope.balance.costs import StageCosts
    from ppscope.balance.modelled.gpus import gpu_named
    from ppscope.balance.modelled.roofline import Workload, model_costs

    work = Workload(phase="decode", batch=args.batch, context=args.context, dtype=args.dtype, tp=plan["tp"])
    modelled = model_costs(shape, gpu_named(args.gpu), work)
    problem = BalanceProblem(costs=modelled.layer_costs(), stages=plan["pp"], stage_costs=StageCosts())

    def times(split: list[int] | None) -> list[float] | None:
        return None if split is None else list(evaluate(problem, split).stage_ms)

    return {
        "gpu": modelled.gpu.name,
        "phase": "decode",
        "batch": work.batch,
        "context": work.context,
        "stage_ms": times(plan["split"]),
        "fix_stage_ms": times(plan["fix_split"]),
        "assumptions": modelled.assumptions(),
    }


def print_step_times(d: dict[str, Any]) -> None:
    s = d["step_times"]
    now = s["stage_ms"]
    slowest = max(now)
    print(
        f"decode step on {s['gpu']} ({s['batch']} sequence(s) x {s['context']} tokens of context), per stage: "
        f"{', '.join(f'{t:.3f}' for t in now)} ms; the slowest, stage {now.index(slowest)}, paces the pipeline "
        f"at {1e3 / slowest:.0f} micro-batch steps/s"
        + (
            f"; with split {','.join(map(str, d['fix_split']))}: {max(s['fix_stage_ms']):.3f} ms"
            if s["fix_stage_ms"]
            else ""
        )
    )
    print(f"  (the cost model: {s['assumptions'][0]})")
