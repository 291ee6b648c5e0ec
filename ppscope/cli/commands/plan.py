"""`ppscope plan`: plan memory per stage and the TP x PP layout for a model and cluster."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ppscope.balance.modelled.plan import CapacityPlan, StagePlan, StepTimes
    from ppscope.cli.argtypes import Subcommands

HELP = "Plan memory per stage and the TP x PP layout for a model and cluster"
EXAMPLE = "ppscope plan --model llama3-70b --gpus 4 --gpu-mem-gib 40 --pp 4 --max-model-len 8192"

_DESCRIPTION = (
    f"{HELP}: weights per stage, KV cache per token, KV capacity per stage and for the pipeline, the extra "
    "memory of the first (embedding) and last (LM head, logits) stages, a recommended TP x PP, and the split "
    "that fixes a stage that runs out of memory. Sizes are per GPU; the assumptions are printed."
)


def register(sub: Subcommands) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "plan", help=HELP, description=_DESCRIPTION, epilog=f"example: {EXAMPLE}"
    )
    p.add_argument(
        "--model",
        required=True,
        help="a preset (llama3-8b/70b, llama3.1-405b, qwen2.5-7b/32b/72b, qwen3-8b/32b, "
        "mixtral-8x7b/8x22b, deepseek-v3, tiny) or a config.json",
    )
    p.add_argument("--gpus", type=int, required=True, help="GPUs available in all")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--gpu-mem-gib", type=float, help="memory of one GPU in GiB (default: --gpu's, else 80)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="share the engine may use (0.9)")
    p.add_argument(
        "--dtype",
        help="weights dtype: fp32, fp16, bf16, fp8 or float32, float16, bfloat16 (default: the model's own, as its "
        "checkpoint ships it: bf16 for most, fp8 for DeepSeek-V3)",
    )
    p.add_argument("--kv-dtype", default="", help="KV cache dtype (default: the weights dtype)")
    p.add_argument("--max-model-len", type=int, default=0, help="longest sequence in tokens (default: the model's)")
    p.add_argument("--max-num-seqs", type=int, default=256, help="sequences per batch, sizes the logits (256)")
    p.add_argument("--reserve-gib", type=float, default=1.0, help="per GPU for activations and runtime (1.0)")
    p.add_argument("--min-sequences", type=int, default=4, help="max-length sequences a stage must hold (4)")
    p.add_argument("--latency-sensitive", action="store_true", help="widest TP in a node, smallest PP that fits")
    p.add_argument("--tp", type=int, default=0, help="evaluate this tensor-parallel size instead of recommending")
    p.add_argument("--pp", type=int, default=0, help="evaluate this pipeline-parallel size instead of recommending")
    p.add_argument("--split", default="", help="evaluate these layer counts per stage (default: vLLM's rule)")
    _add_gpu_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (keys documented in the README)")
    p.set_defaults(func=run)


def _add_gpu_arguments(p: argparse.ArgumentParser) -> None:
    """--gpu and the decode pass it times: the step time of each stage from the cost model."""
    from ppscope.cli.model_costs import add_workload_arguments

    group = p.add_argument_group("step time (with --gpu: each stage's modelled decode step)")
    add_workload_arguments(group, default_gpu_note="; sets --gpu-mem-gib too")


def _gpu_mem_gib(args: argparse.Namespace) -> tuple[float, str]:
    """--gpu-mem-gib, else the capacity the driver reports for --gpu (GiB, not the datasheet's GB), else 80; and
    where it comes from."""
    from ppscope.balance.modelled.gpus import gpu_named

    if args.gpu_mem_gib is not None:
        return float(args.gpu_mem_gib), "--gpu-mem-gib"
    if not args.gpu:
        return 80.0, "the default; give --gpu or --gpu-mem-gib"
    gpu = gpu_named(args.gpu)
    return gpu.memory_gib, f"{gpu.memory_gib_source}; the datasheet's {gpu.memory_gb:g} GB"


def run(args: argparse.Namespace) -> int:
    from ppscope.balance.modelled.gpus import gpu_named
    from ppscope.balance.modelled.plan import Cluster, PlanConfig, plan, step_times
    from ppscope.balance.modelled.shapes import ModelShape, renamed_note
    from ppscope.balance.split import parse_split

    model = ModelShape.from_spec(args.model)
    mem_gib, mem_source = _gpu_mem_gib(args)
    split = tuple(parse_split(args.split, model.layers, args.pp or None)) if args.split else ()
    cfg = PlanConfig(
        model=model,
        cluster=Cluster(
            gpus=args.gpus,
            gpus_per_node=args.gpus_per_node,
            gpu_mem_gib=mem_gib,
            gpu_mem_source=mem_source,
            gpu_memory_utilization=args.gpu_memory_utilization,
        ),
        dtype=args.dtype or model.dtype,
        kv_dtype=args.kv_dtype,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        reserve_gib=args.reserve_gib,
        min_sequences=args.min_sequences,
        latency_sensitive=args.latency_sensitive,
        tp=args.tp,
        pp=args.pp,
        split=split,
    )
    capacity = plan(cfg)
    if (note := renamed_note(args.model)) is not None:
        capacity = dataclasses.replace(capacity, warnings=(note, *capacity.warnings))
    steps = None
    if args.gpu:
        gpu = gpu_named(args.gpu).at_peak() if args.peak else gpu_named(args.gpu)
        steps = step_times(capacity, gpu, batch=args.batch, context=args.context)
    if args.json:
        print(json.dumps(capacity.to_dict() | ({"step_times": steps.to_json()} if steps else {}), indent=2))
    else:
        _print(capacity, steps)
    return 0


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f}"


def _stage_table(title: str, capacity: CapacityPlan, rows: Sequence[StagePlan]) -> None:
    from rich.table import Table

    from ppscope.analysis.report import stdout_console

    cfg = capacity.config
    table = Table(title=title, caption_justify="left")
    table.caption = (
        f"weights (decoder layers) + extra + KV + reserve {_gib(cfg.reserve_gib * 2**30)} GiB = the usable "
        f"{_gib(cfg.cluster.usable_bytes)} GiB of each GPU (KV is negative where a stage does not fit)"
    )
    for col in ("stage", "layers", "weights\nGiB", "extra\nGiB", "KV\nGiB", "KV\ntokens", "max-len\nseqs", "fits"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in rows:
        table.add_row(
            str(r.stage),
            str(r.layers),
            _gib(r.layer_weights_bytes),
            _gib(r.extra_bytes),
            _gib(r.kv_bytes),
            f"{max(r.kv_tokens, 0):,}",
            str(max(r.kv_sequences, 0)),
            "yes" if r.fits else "NO",
        )
    stdout_console().print(table)


def _print(capacity: CapacityPlan, steps: StepTimes | None) -> None:
    from ppscope.balance.split import format_split

    cfg, layout, stages = capacity.config, capacity.layout, capacity.stages
    print(
        f"{cfg.model.name} in {cfg.dtype} on {cfg.cluster.gpus} GPU(s): TP={layout.tp} x PP={layout.pp}, "
        f"{layout.replicas} replica(s) — {layout.reason}"
    )
    print(
        f"KV cache: {capacity.kv_bytes_per_token_per_layer:,} B per token per layer "
        f"({capacity.kv_bytes_per_token_per_layer_per_gpu:,} B per GPU); max-model-len {cfg.seq_len}"
    )
    weights = [r.weights_bytes for r in stages]
    total = sum(weights) * layout.tp
    print(
        f"weights per GPU, layers + extra: {', '.join(_gib(w) for w in weights)} GiB "
        f"(the pipeline's {layout.tp * layout.pp} GPU(s) hold {_gib(total)} GiB)"
    )
    print(
        f"first stage extra (embedding): {_gib(stages[0].extra_bytes)} GiB; "
        f"last stage extra (LM head + logits): {_gib(stages[-1].extra_bytes)} GiB"
    )
    _stage_table(f"per GPU, split {format_split(capacity.split)}", capacity, stages)
    print(
        f"pipeline KV capacity: {capacity.pipeline_kv_tokens:,} tokens = {capacity.pipeline_kv_sequences} "
        f"sequence(s) of {cfg.seq_len} tokens (the smallest stage's): room for KV cache is "
        f"{capacity.kv_verdict.upper()}"
    )
    for warning in capacity.warnings:
        print(f"warning: {warning}")
    if capacity.fix_split is not None and capacity.fix_stages is not None:
        fix = capacity.fix_split
        tokens = min(r.kv_tokens for r in capacity.fix_stages)
        print(
            f"split {format_split(fix)} "
            + ("fixes it" if not capacity.fits else "holds more KV cache")
            + f": pipeline KV capacity {tokens:,} tokens; use VLLM_PP_LAYER_PARTITION={format_split(fix)}"
        )
        _stage_table("with that split", capacity, capacity.fix_stages)
    if steps is not None:
        from ppscope.cli.model_costs import print_step_times

        print_step_times(steps, capacity.fix_split)
    print("Assumptions:")
    for a in capacity.assumptions:
        print(f"  - {a}")
