"""`ppscope rebalance`: advise the layer split that minimises the slowest stage."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ppscope.trace.actions import Phase

HELP = "Advise the layer split that minimises the slowest stage"
EXAMPLE = (
    "ppscope rebalance runs/r1   |   ppscope rebalance --layer-costs 1,1,1,1,1,1,1,1 --head-cost 3 --stages 4   |   "
    "ppscope rebalance --model llama3-70b --stages 4 --gpu h100-sxm   |   ppscope rebalance trace.sqlite --model "
    "config.json --current-split 20,20,20,20"
)

_DESCRIPTION = (
    f"{HELP}, exactly, over contiguous splits. Costs come from the compute spans of one or more runs (more runs "
    "with different splits make the fit exact) or from --layer-costs (ms per layer). Stage time = embedding "
    "(first stage) + its layers + LM head and sampling (last stage) + --overhead-ms, divided by --speeds, plus "
    "--comm-ms. Without a run, --model with --gpu times every layer from the model's shape and the GPU's "
    "datasheet; with an nsys or Kineto trace of another engine, --model's costs are calibrated on the trace's "
    "stage busy times. Prints current vs proposed split, per-stage times, the predicted speedup, KV capacity per stage "
    "(with --model/--gpu-mem-gib) and the split as vLLM, SGLang, Megatron, torchtitan and ppscope take it. A training "
    "run of torch.distributed.pipelining (the recording hook's, or Kineto traces with --current-split) is costed "
    "by each micro-batch's forward + backward, per virtual stage under interleaved schedules."
)


def add_cost_arguments(p: argparse.ArgumentParser) -> None:
    """The options that give costs without a run (shared with `ppscope simulate`)."""
    p.add_argument("--layer-costs", metavar="MS,MS,...", help="forward time of each decoder layer, ms")
    p.add_argument("--layers", type=int, help="with --layer-cost-ms: that many layers of equal cost")
    p.add_argument("--layer-cost-ms", type=float, help="with --layers: the cost of every layer, ms")
    p.add_argument("--embed-cost", "--embed-cost-ms", dest="embed_cost", type=float, help="embedding, ms")
    p.add_argument("--head-cost", "--head-cost-ms", dest="head_cost", type=float, help="LM head, ms")
    p.add_argument("--sample-cost", "--sample-cost-ms", dest="sample_cost", type=float, help="sampling, ms")


def costs_from_args(
    args: argparse.Namespace,
    fitted: Any = None,
    *,
    missing: str = "give a RUN to fit costs from, or --layer-costs MS,MS,... (one per layer)",
) -> Any:
    """LayerCosts from the options, on top of `fitted` costs when given; `missing` says what to give."""
    from ppscope.balance.costs import LayerCosts, parse_ms_list
    from ppscope.errors import InvalidConfigError

    if args.layer_costs and (args.layers or args.layer_cost_ms is not None):
        raise InvalidConfigError("give either --layer-costs or --layers with --layer-cost-ms, not both")
    if args.layer_costs:
        layer_ms = tuple(parse_ms_list(args.layer_costs, "--layer-costs"))
    elif args.layers or args.layer_cost_ms is not None:
        if not args.layers or args.layer_cost_ms is None:
            raise InvalidConfigError("--layers and --layer-cost-ms go together: e.g. --layers 32 --layer-cost-ms 1.5")
        layer_ms = LayerCosts.uniform(args.layers, args.layer_cost_ms).layer_ms
    elif fitted is not None:
        layer_ms = fitted.layer_ms
    else:
        raise InvalidConfigError(missing)
    base = fitted or LayerCosts(layer_ms=layer_ms)

    def pick(value: float | None, default: float) -> float:
        return default if value is None else value

    return LayerCosts(
        layer_ms=layer_ms,
        embed_ms=pick(args.embed_cost, base.embed_ms),
        head_ms=pick(args.head_cost, base.head_ms),
        sample_ms=pick(args.sample_cost, base.sample_ms),
    )


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "rebalance", help=HELP, description=_DESCRIPTION, epilog=f"example: {EXAMPLE}"
    )
    p.add_argument("runs", nargs="*", metavar="RUN", help="run directories to fit costs from (the last is current)")
    add_cost_arguments(p)
    p.add_argument("--stages", type=int, help="pipeline stages (default: the run's)")
    p.add_argument(
        "--current-split",
        help="layer counts per stage now (default: the run's, else vLLM's rule); per virtual stage for a training "
        "trace that records none",
    )
    p.add_argument(
        "--costs",
        choices=("auto", "insitu", "profile", "fit"),
        default="auto",
        help="with RUN: insitu: the layer spans timed inside the run (--layer-spans); profile: the run's isolated "
        "per-layer profile (profile.json, `ppscope run --profile-layers`); fit: a least-squares fit of its stage "
        "spans; auto: insitu when the last run has layer spans, else the profile when it has one, else the fit "
        "(default)",
    )
    p.add_argument(
        "--phase", choices=(Phase.DECODE.value, Phase.PREFILL.value, "all"), help="passes to use (default: decode)"
    )
    p.add_argument(
        "--mix",
        action="store_true",
        help="fit runs of different models, dtypes, devices or schedules together (refused otherwise)",
    )
    p.add_argument("--overhead-ms", default="0", help="fixed time per stage: one value or one per stage")
    p.add_argument("--comm-ms", default="0", help="time of each stage's hop to the next: one value or one per stage")
    p.add_argument("--speeds", default="1", help="relative speed of each stage's GPU: one value or one per stage")
    p.add_argument(
        "--objective",
        choices=("throughput", "memory"),
        default="throughput",
        help="throughput: fastest slowest stage, ties to more KV cache (default); memory: most KV cache, ties to "
        "the fastest",
    )
    mem = p.add_argument_group("memory (for KV capacity and memory limits)")
    mem.add_argument("--model", help="preset or config.json giving weight and KV sizes (default: the run's model)")
    mem.add_argument("--gpu-mem-gib", help="GPU memory per stage, GiB: one value or one per stage")
    mem.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="share of GPU memory usable (0.9)")
    mem.add_argument("--dtype", help="weights and KV dtype (default: the run's, else fp16)")
    mem.add_argument("--tp", type=int, default=1, help="tensor-parallel size within each stage")
    mem.add_argument("--reserve-gib", type=float, default=1.0, help="per GPU, for activations and runtime")
    mem.add_argument("--min-kv-tokens", type=int, default=0, help="KV tokens every stage must hold")
    _add_model_arguments(p)
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="read a run directory's rank files in N processes, a rank at a time (default 1)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (keys documented in the README)")
    p.set_defaults(func=run)


def _add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The cost model's options: costs from --model and --gpu with no run, or calibrated on a TRACE."""
    from ppscope.cli.model_costs import DEFAULT_GPU, add_workload_arguments

    group = p.add_argument_group(
        "cost model (--model and --gpu without a run, or an nsys/Kineto TRACE with --model): --phase, --tp and "
        "--dtype (default bf16) set the pass too"
    )
    add_workload_arguments(group, default_gpu_note=f" (with a TRACE, default {DEFAULT_GPU})")


def _run_model(args: argparse.Namespace) -> int:
    """Advice from the cost model, with no run or calibrated on another engine's trace."""
    from ppscope.cli.commands.plan import model_shape
    from ppscope.cli.model_costs import advise_from_model, print_assumptions, print_model_lines

    out, problem, advice = advise_from_model(args, model_shape(args.model))
    out.update(_advice(args, [], problem, advice, "costs modelled from the model and the GPU, not measured"))
    out["training"] = None  # the cost model times inference passes
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print_model_lines(out, args.runs[-1] if args.runs else "")
    _print(out, True)
    print_assumptions(out)
    return 0


def _per_stage(text: str, what: str, stages: int) -> float | list[float]:
    from ppscope.balance.costs import parse_ms_list
    from ppscope.errors import InvalidConfigError

    values = parse_ms_list(text, what)
    if len(values) == 1:
        return values[0]
    if len(values) != stages:
        raise InvalidConfigError(f"{what} gives {len(values)} values for {stages} stages: give one, or one per stage")
    return values


def _advice(
    args: argparse.Namespace, traces: list[Any], problem: Any, advice: Any, no_interval: str = ""
) -> dict[str, Any]:
    """The interval of the predicted speedup from the runs' own variability, and keep or change."""
    from ppscope.balance.advise.advice import Advice, advise, speedup_interval

    cur, new = advice.current.split, advice.proposed.split
    interval = speedup_interval(traces, problem, cur, new) if traces and cur != new else None
    if problem.objective == "memory":
        decision = Advice(change=cur != new, reason="objective memory: the split that holds the most KV cache")
    else:
        why = no_interval or (
            "costs given without a run" if not traces else "the runs are too short to tell how they vary"
        )
        decision = advise(cur, new, advice.predicted_speedup, interval, why)
    return {
        "predicted_interval": None if interval is None else [interval.low, interval.high],
        "predicted_interval_how": None if interval is None else f"{interval.level:.0%} interval, {interval.how}",
        "advice": decision.word,
        "advice_reason": decision.reason,
    }


def _given_costs(args: argparse.Namespace) -> str:
    return "--layer-costs" if args.layer_costs else "--layers"


def _check_given_layers(args: argparse.Namespace, split: list[int]) -> None:
    """Costs given on the command line describe the run's model: one per layer of its split."""
    from ppscope.errors import InvalidConfigError

    layers = costs_from_args(args).layers
    if layers != sum(split):
        raise InvalidConfigError(
            f"{_given_costs(args)} gives {layers} layer cost(s) but the run has {sum(split)} layers "
            f"(split {','.join(map(str, split))}): give one cost per layer of the run's model"
        )


def _model_shape(args: argparse.Namespace, run_model: dict[str, Any]) -> Any:
    from ppscope.balance.modelled.shapes import ModelShape
    from ppscope.cli.commands.plan import model_shape

    if args.model:
        return model_shape(args.model)
    fields = {"name", "layers", "hidden", "heads", "kv_heads", "intermediate", "vocab"}
    if fields <= set(run_model):
        return ModelShape(**{k: run_model[k] for k in fields | {"tie_embeddings"} if k in run_model})
    return None


def _read_profile(args: argparse.Namespace) -> Any:
    """The last run's profile.json when --costs may use it, else None."""
    from pathlib import Path

    from ppscope.balance.measured.profile import read_profile

    last = Path(args.runs[-1])
    return read_profile(last) if args.costs != "fit" and last.is_dir() else None


def _training(args: argparse.Namespace, traces: list[Any]) -> dict[str, Any] | None:
    """For a training run: what its costs are and where they came from, and the last trace with the split
    given by --current-split when it records none (in memory: the files are only read)."""
    import dataclasses

    from ppscope.balance.measured.training import TRAIN_PASSES, is_training
    from ppscope.balance.split import parse_counts, validate_split

    last = traces[-1]
    if not is_training(last):
        return None
    meta = last.meta
    if not meta.split and args.current_split:
        split = parse_counts(args.current_split, "4,4")
        validate_split(split, sum(split))
        meta = dataclasses.replace(meta, split=split, split_source="--current-split")
        traces[-1] = dataclasses.replace(last, meta=meta)
    origin = {
        "pipelining": "the recording hook's forward and backward spans",
        "kineto": "the Kineto trace's operators, each counted in the pipelining action it ran in",
    }.get(meta.source, "the run's forward and backward compute spans")
    virtual = meta.chunks > 1
    return {
        "passes": TRAIN_PASSES,
        "from": origin,
        "split_source": meta.split_source or None,
        "chunks": meta.chunks,
        "virtual_stages": virtual,
        "assumption": (
            f"the split is per virtual stage ({meta.chunks} per rank) and is balanced over them, each virtual stage "
            "as a stage of its own: the schedule is assumed to run at the pace of its slowest virtual stage"
            if virtual
            else None
        ),
    }


def _timings(path: str, workers: int) -> Any:
    """What the costs read of a run: a run directory rank by rank (`run_timings`), anything else loaded whole."""
    from ppscope.balance.measured.timings import RunTimings, run_timings
    from ppscope.formats.detect import InputKind, detect
    from ppscope.formats.sources import open_trace

    found = detect(path)
    return run_timings(found.path, workers=workers) if found.kind == InputKind.RUN else RunTimings.of(open_trace(path))


def run(args: argparse.Namespace) -> int:
    from ppscope.balance.advise.problem import BalanceProblem
    from ppscope.balance.advise.rebalance import rebalance
    from ppscope.balance.costs import StageCosts
    from ppscope.balance.measured.choose import run_costs
    from ppscope.balance.modelled.plan import stage_memory_model
    from ppscope.balance.split import parse_split
    from ppscope.cli.model_costs import wants_model
    from ppscope.errors import InvalidConfigError, UnsupportedInputError

    if wants_model(args):
        return _run_model(args)
    fit, profiled, run_model, current, measured, training = None, None, {}, None, None, None
    source, insitu = "fit", None
    notes: tuple[str, ...] = ()
    stages = args.stages
    given = bool(args.layer_costs or args.layers or args.layer_cost_ms is not None)
    if args.runs:
        traces = [_timings(r, args.workers) for r in args.runs]
        training = _training(args, traces)
        meta = traces[-1].meta
        run_model, current = meta.model, list(meta.split) or None
        if given and current is not None:
            _check_given_layers(args, current)
        try:
            got = run_costs(
                traces, _read_profile(args), choice=args.costs, phase=args.phase, where=args.runs[-1], mix=args.mix
            )
        except UnsupportedInputError:
            if not given:
                raise
            got = None  # the costs given need only the run's split, which the comparison fit could not use
        if got is not None:
            fit, notes, source, insitu = got.fit, got.notes, got.source, got.insitu
            profiled = got.costs if got.source in ("profile", "insitu") else None
        args.dtype = args.dtype or str(meta.config.get("dtype") or "") or None
        if fit is not None:
            last_run = [o for o in fit.observations if o.run == len(traces) - 1]
            measured = [o.pass_ms + (o.embed_ms or 0.0) + (o.head_ms or 0.0) + (o.sample_ms or 0.0) for o in last_run]
        if current is not None:
            if stages is not None and stages != len(current):
                raise InvalidConfigError(f"--stages {stages} differs from the run's {len(current)} stages")
            stages = len(current)
    base = profiled if profiled is not None else (fit.costs if fit else None)
    costs = costs_from_args(args, base)
    if stages is None:
        raise InvalidConfigError("give --stages P with --layer-costs")
    if args.current_split:
        current = parse_split(args.current_split, costs.layers, stages)
    args.dtype = args.dtype or "fp16"
    shape = _model_shape(args, run_model)
    if shape is not None and shape.layers != costs.layers:
        raise InvalidConfigError(
            f"--model {args.model or shape.name} has {shape.layers} layers but "
            f"{_given_costs(args) if given else 'the costs'} cover {costs.layers}: give one cost per layer of the "
            "model whose split you want"
        )
    memory = None
    if args.gpu_mem_gib:
        if shape is None:
            raise InvalidConfigError("--gpu-mem-gib needs --model (a preset or config.json) to size weights and KV")
        gib = _per_stage(args.gpu_mem_gib, "--gpu-mem-gib", stages)
        memory = stage_memory_model(
            shape,
            [gib] * stages if isinstance(gib, float) else gib,
            gpu_memory_utilization=args.gpu_memory_utilization,
            dtype=args.dtype,
            tp=args.tp,
            reserve_gib=args.reserve_gib,
            min_kv_tokens=args.min_kv_tokens,
        )
    problem = BalanceProblem(
        costs=costs,
        stages=stages,
        stage_costs=StageCosts(
            overhead_ms=_per_stage(args.overhead_ms, "--overhead-ms", stages),
            comm_ms=_per_stage(args.comm_ms, "--comm-ms", stages),
            speed=_per_stage(args.speeds, "--speeds", stages),
        ),
        memory=memory,
        objective=args.objective,
    )
    advice = rebalance(problem, current, chunks=training["chunks"] if training else 1)
    out = advice.to_dict()
    out.update(_advice(args, traces if args.runs else [], problem, advice))
    out["costs"] = {
        "layer_ms": list(costs.layer_ms),
        "embed_ms": costs.embed_ms,
        "head_ms": costs.head_ms,
        "sample_ms": costs.sample_ms,
    }
    out["kv_bytes_per_token"] = (
        None if shape is None else [n * shape.kv_bytes_per_token_per_layer(args.dtype) for n in advice.proposed.split]
    )
    out["fit"] = None
    out["cost_source"] = "given" if given else source
    out["insitu"] = None
    if insitu is not None:
        out["insitu"] = {
            "phase": insitu.phase,
            "runs": insitu.runs,
            "passes": list(insitu.passes),
            "rest_ms": list(insitu.rest_ms),
        }
    out["measured_stage_ms"] = measured
    out["training"] = training
    if fit is not None:
        out["fit"] = {
            "phase": fit.phase,
            "runs": len(args.runs),
            "uniform_layer_ms": fit.uniform_layer_ms,
            "r_squared": fit.r_squared,
            "rms_residual_ms": fit.rms_residual_ms,
            "layer_rms_residual_ms": fit.layer_rms_residual_ms,
            "extras_measured": fit.extras_measured,
            "notes": [*notes, *fit.notes],
        }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        _print(out, shape is not None)
    return 0


def _print(d: dict[str, Any], has_model: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    from ppscope.balance.measured.fit import r_squared_text

    fit = d["fit"]
    training = d["training"]
    if training is not None:
        print(
            "training run: each layer's cost is its forward + backward per micro-batch (F + B, or F + I + W), "
            + (
                "timed layer by layer in sampled micro-batches (the hook's layer spans)"
                if d["cost_source"] == "insitu"
                else f"from {training['from']}, fitted per stage"
            )
            + (f"; split from {training['split_source']}" if training["split_source"] else "")
        )
        if training["assumption"]:
            print(f"  {training['assumption']}")
    if d["cost_source"] == "insitu":
        got = d["insitu"]
        print(
            f"costs: timed layer by layer inside the run ({got['phase']} passes, median of {min(got['passes'])}-"
            f"{max(got['passes'])} sampled passes per layer); the fit from its stage spans is for comparison"
        )
    if d["cost_source"] == "profile":
        print("costs: the run's per-layer profile (profile.json); the fit from its stage spans is for comparison")
    if d["cost_source"] == "given":
        print(
            "costs: the layer costs given on the command line"
            + ("; the run's fit below is for comparison" if fit else "")
        )
    if fit is not None:
        print(
            f"costs fitted from {fit['runs']} run(s), {fit['phase']} passes: {fit['uniform_layer_ms']:.3f} ms per "
            f"layer on average, {r_squared_text(fit['r_squared'])} (uniform model, RMS error "
            f"{fit['rms_residual_ms']:.3f} ms), "
            f"per-layer RMS error {fit['layer_rms_residual_ms']:.3f} ms"
        )
        for note in fit["notes"]:
            print(f"  note: {note}")
    c = d["costs"]
    print(
        f"embedding {c['embed_ms']:.3f} ms (first stage), LM head {c['head_ms']:.3f} ms + sampling "
        f"{c['sample_ms']:.3f} ms (last stage), layers {sum(c['layer_ms']):.3f} ms in all"
    )
    table = Table(title=f"objective: {d['objective']}")
    cols = [
        "virtual stage" if training and training["virtual_stages"] else "stage",
        "layers now",
        "ms now",
        "layers new",
        "ms new",
    ]
    measured = d["measured_stage_ms"]
    if measured is not None and len(measured) == len(d["current_split"]):
        cols.insert(3, "measured ms")  # what the last run's spans show, next to the model's "ms now"
    kv = d["kv_tokens"]
    if kv["current"] is not None:
        cols += ["KV tokens now", "KV tokens new"]
    for col in cols:
        table.add_column(col, justify="right")
    for s in range(len(d["proposed_split"])):
        row = [
            str(s),
            str(d["current_split"][s]),
            f"{d['stage_times_ms']['current'][s]:.3f}",
            *([f"{measured[s]:.3f}"] if "measured ms" in cols else []),
            str(d["proposed_split"][s]),
            f"{d['stage_times_ms']['proposed'][s]:.3f}",
        ]
        if kv["current"] is not None:
            row += [f"{kv['current'][s]:,}" if kv["current"][s] >= 0 else "does not fit", f"{kv['proposed'][s]:,}"]
        table.add_row(*row)
    Console().print(table)
    bn, mx = d["bottleneck_stage"], d["max_stage_ms"]
    print(
        f"slowest stage: {bn['current']} at {mx['current']:.3f} ms now, {bn['proposed']} at {mx['proposed']:.3f} ms "
        f"proposed: predicted speedup ×{d['predicted_speedup']:.3f}"
        + (
            f" ({d['predicted_interval_how']}: {d['predicted_interval'][0]:.3f}–{d['predicted_interval'][1]:.3f})"
            if d["predicted_interval"]
            else ""
        )
    )
    keep = d["advice"] == "keep"
    print(f"advice: {'KEEP the current split' if keep else 'change the split'}: {d['advice_reason']}")
    cap = d["kv_capacity_tokens"]
    if cap["current"] is not None:
        print(f"pipeline KV capacity (smallest stage): {max(cap['current'], 0):,} -> {cap['proposed']:,} tokens")
    elif d["kv_bytes_per_token"] is not None:
        per = "; ".join(f"stage {s}: {b} B" for s, b in enumerate(d["kv_bytes_per_token"]))
        print(f"KV cache per token (proposed split): {per}; give --gpu-mem-gib for KV capacity")
    elif not has_model and training is None:  # a training run keeps no KV cache
        print("KV capacity: give --model and --gpu-mem-gib")
    if keep:
        print(f"the proposed split, not advised: {d['vllm_env']}")
        return
    print("ready to paste:")
    print(f"  {d['vllm_env']}")
    print(f"  {d['sglang_env']}")
    print(f"  Megatron: {d['megatron_args']}" if d["megatron_args"] else "  Megatron: (one stage: no flags needed)")
    print(f"  Megatron: {d['megatron_layout']}")
    print(f"  torchtitan ([parallelism] in the job's .toml): {d['torchtitan_toml']}")
    print(f"  torchtitan: {d['torchtitan_args']}")
    print(f"  {d['ppscope_run']}")
