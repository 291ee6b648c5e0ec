"""`ppscope rebalance`: advise the layer split that minimises the slowest stage."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import TYPE_CHECKING

from ppscope.cli.cost_options import add_cost_arguments, given_costs

if TYPE_CHECKING:
    from ppscope.balance.measured.profile import LayerProfile
    from ppscope.balance.measured.timings import RunTimings
    from ppscope.balance.report import RebalanceReport, RebalanceRequest, TraceStages
    from ppscope.cli.argtypes import Subcommands
    from ppscope.trace.model import Trace
    from ppscope.trace.notices import Notice

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


def register(sub: Subcommands) -> None:
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
    _add_evidence_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (keys documented in the README)")
    p.set_defaults(func=run)


def _add_evidence_arguments(p: argparse.ArgumentParser) -> None:
    """What a trace of another engine must show before a split is advised, and how the user says the rest."""
    evidence = p.add_argument_group("a trace of another engine")
    evidence.add_argument(
        "--assume-pipeline",
        action="store_true",
        help="advise on a trace that does not show a pipeline (its ranks exchange no message), taking its ranks as "
        "stages in the order `analyze` gives them; refused otherwise (exit 4)",
    )
    evidence.add_argument("--stage-of-rank", metavar="SPEC", help="which stage each rank runs, as for `analyze`")


def _add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The cost model's options: costs from --model and --gpu without a run, or calibrated on a TRACE."""
    from ppscope.balance.modelled.gpus import DEFAULT_GPU
    from ppscope.cli.model_costs import add_workload_arguments

    group = p.add_argument_group(
        "cost model (--model and --gpu without a run, or an nsys/Kineto TRACE with --model): --phase, --tp and "
        "--dtype (default bf16) set the pass too"
    )
    add_workload_arguments(group, default_gpu_note=f" (with a TRACE, default {DEFAULT_GPU})")


def run(args: argparse.Namespace) -> int:
    from ppscope.balance.report import rebalance_model, rebalance_runs
    from ppscope.cli.model_costs import wants_model
    from ppscope.errors import ErrorCode, InvalidConfigError

    request = _request(args)
    assumed: list[Notice] = []
    if wants_model(args):
        if request.model is None:
            raise InvalidConfigError(ErrorCode.MISSING_OPTION, "the cost model needs --model")
        if len(args.runs) > 1:
            raise InvalidConfigError(
                ErrorCode.CONFLICTING_OPTIONS, "give one trace of another engine to calibrate the model on, not several"
            )
        trace = _trace_stages(_pipeline_trace(args.runs[-1], args, assumed), args.runs[-1]) if args.runs else None
        report = rebalance_model(request.model, request, trace)
    else:
        whole: dict[str, Trace] = {}  # the last run's trace, where it is loaded whole anyway: the replay's
        runs = [_timings(r, args, assumed, whole if i == len(args.runs) - 1 else {}) for i, r in enumerate(args.runs)]
        where = args.runs[-1] if args.runs else "the run"
        report = rebalance_runs(runs, request, profile=_read_profile(args), where=where)
        if args.runs:
            report = _replayed(report, args.runs[-1], whole)
    if assumed:
        report = dataclasses.replace(report, assumed_pipeline=assumed[-1])
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print_report(report, args.runs[-1] if args.runs else "")
    return 0


def _request(args: argparse.Namespace) -> RebalanceRequest:
    """Every option that changes the answer, as the library takes them."""
    from ppscope.balance.modelled.shapes import ModelShape
    from ppscope.balance.report import RebalanceRequest

    return RebalanceRequest(
        given=given_costs(args),
        stages=args.stages,
        current_split=args.current_split,
        cost_choice=args.costs,
        phase=args.phase,
        mix=args.mix,
        overhead_ms=args.overhead_ms,
        comm_ms=args.comm_ms,
        speeds=args.speeds,
        objective=args.objective,
        model=ModelShape.from_spec(args.model) if args.model else None,
        model_name=args.model or "",
        gpu_mem_gib=args.gpu_mem_gib,
        gpu_memory_utilization=args.gpu_memory_utilization,
        dtype=args.dtype,
        tp=args.tp,
        reserve_gib=args.reserve_gib,
        min_kv_tokens=args.min_kv_tokens,
        gpu=args.gpu,
        batch=args.batch,
        context=args.context,
        peak=args.peak,
    )


def _timings(path: str, args: argparse.Namespace, assumed: list[Notice], whole: dict[str, Trace]) -> RunTimings:
    """What the costs read of a run: a run directory rank by rank (`run_timings`), anything else loaded whole
    (and kept in `whole` by path, for the replay of the last run)."""
    from ppscope.balance.measured.timings import RunTimings, run_timings
    from ppscope.formats.detect import InputKind, detect

    found = detect(path)
    if found.kind == InputKind.RUN:
        return run_timings(found.path, workers=args.workers)
    whole[path] = _pipeline_trace(path, args, assumed)
    return RunTimings.of(whole[path])


REPLAY_SPANS = 2_000_000
"""A run of more spans than this is not replayed: the replay holds every span in memory (about 400 bytes each:
2,000,000 spans is about 800 MB), where rebalance otherwise reads one rank file at a time."""


def _replayed(report: RebalanceReport, path: str, whole: dict[str, Trace]) -> RebalanceReport:
    """The report led by the schedule replay of the last run (`ppscope.simulate.advice.with_replay`), or as it
    is with the reason where the run is too large to load whole or cannot be replayed."""
    import dataclasses

    from ppscope.errors import PPScopeError
    from ppscope.simulate.advice import with_replay
    from ppscope.trace.store import load_run, span_count

    trace = whole.get(path)
    if trace is None:
        spans = span_count(path)
        if spans > REPLAY_SPANS:
            why = (
                f"the run has {spans:,} spans, more than the {REPLAY_SPANS:,} the replay holds in memory at once; "
                "record fewer steps (or fewer layer spans) to have it replayed"
            )
            return dataclasses.replace(report, simulated_note=why)
        try:
            trace = load_run(path)
        except PPScopeError as exc:
            return dataclasses.replace(report, simulated_note=str(exc))
    return with_replay(report, trace)


def _pipeline_trace(path: str, args: argparse.Namespace, assumed: list[Notice]) -> Trace:
    """Another engine's trace, its ranks placed by --stage-of-rank when given. Refused (exit 4) when nothing in
    it shows a pipeline, unless the user says it is one; what it lacked then goes into `assumed`."""
    from ppscope.analysis.pipeline import pipeline_evidence
    from ppscope.analysis.placement import apply_placement, parse_stage_of_rank, placement_of
    from ppscope.errors import ErrorCode, NoEvidenceError
    from ppscope.formats.sources import open_trace

    trace = open_trace(path)
    if args.stage_of_rank:
        placement = placement_of(trace, parse_stage_of_rank(args.stage_of_rank))
        return trace if placement is None else apply_placement(trace, placement)
    missing = pipeline_evidence(trace)
    if missing is not None:
        if not args.assume_pipeline:
            raise NoEvidenceError(
                ErrorCode.NO_PIPELINE_EVIDENCE,
                f"{path}: no split advised: {missing.text}; pass --assume-pipeline to take its ranks as stages in "
                "the order `ppscope analyze` gives them, or --stage-of-rank to say which stage each rank runs",
            )
        assumed.append(missing)
    return trace


def _trace_stages(trace: Trace, path: str) -> TraceStages:
    """Busy time of each stage of another engine's trace, as `ppscope analyze` measures it."""
    from ppscope.analysis import analyze
    from ppscope.balance.measured.timings import RunTimings
    from ppscope.balance.report import TraceStages, job_kind
    from ppscope.errors import ErrorCode, IncompleteRunError, UnsupportedInputError

    result = analyze(trace)
    if result.window is None:
        raise UnsupportedInputError(
            ErrorCode.NO_SPANS, f"{path} holds no span to time its stages by: nothing to calibrate the model on"
        )
    if result.missing is not None:
        raise IncompleteRunError(
            ErrorCode.MISSING_RANKS, f"{result.missing}: calibrating the model needs every stage's time"
        )
    return TraceStages(
        stage_ms=tuple(s.busy_ns / 1e6 for s in result.stages),
        stage_ranks=tuple(tuple(s.ranks) for s in result.stages),
        window_ms=result.window.length_ns / 1e6,
        window_how=result.window.how,
        job=job_kind(RunTimings.of(trace)),
    )


def _read_profile(args: argparse.Namespace) -> LayerProfile | None:
    """The last run's profile.json when --costs may use it, else None."""
    from pathlib import Path

    from ppscope.balance.measured.profile import read_profile

    if not args.runs:
        return None
    last = Path(args.runs[-1])
    return read_profile(last) if args.costs != "fit" and last.is_dir() else None


def print_report(report: RebalanceReport, where: str) -> None:
    """The report as text: where the costs come from, the table of both splits, the gain, keep or change, and
    the lines to paste."""
    from ppscope.cli.model_costs import print_assumptions, print_model_lines

    if report.assumed_pipeline is not None:
        print(f"assumed a pipeline (--assume-pipeline), though {report.assumed_pipeline.text}")
    if report.model is not None:
        print_model_lines(report.model, where)
    _print_costs(report)
    _print_table(report)
    _print_verdict(report)
    if report.model is not None:
        print_assumptions(report.model)


def _print_costs(report: RebalanceReport) -> None:
    """Where the costs come from, and what they are."""
    from ppscope.balance.measured.fit import r_squared_text

    fit, training, source = report.fit, report.training, report.cost_source
    if training is not None:
        t = training.to_json()
        timed = "timed layer by layer in sampled micro-batches (the hook's layer spans)"
        print(
            "training run: each layer's cost is its forward + backward per micro-batch (F + B, or F + I + W), "
            + (timed if source == "insitu" else f"from {t['from']}, fitted per stage")
            + (f"; split from {training.split_source}" if training.split_source else "")
        )
        if t["assumption"]:
            print(f"  {t['assumption']}")
    if source == "insitu" and report.insitu is not None:
        got = report.insitu
        print(
            f"costs: timed layer by layer inside the run ({got.phase} passes, median of {min(got.passes)}-"
            f"{max(got.passes)} sampled passes per layer): {report.mean_layer_ms:.3f} ms per layer, the mean over "
            "layers; the fit from its stage spans is for comparison"
        )
    if source == "profile":
        print(
            f"costs: the run's per-layer profile (profile.json): {report.mean_layer_ms:.3f} ms per layer, the mean "
            "over layers; the fit from its stage spans is for comparison"
        )
    if source == "given":
        print(
            "costs: the layer costs given on the command line"
            + ("; the run's fit below is for comparison" if fit else "")
        )
    if fit is not None:
        print(
            f"costs fitted from {report.fit_runs} run(s), {fit.phase} passes: {fit.uniform_layer_ms:.3f} ms per "
            f"layer under the uniform fit of each stage's mean pass, {r_squared_text(fit.r_squared)} (RMS error "
            f"{fit.rms_residual_ms:.3f} ms), per-layer RMS error {fit.layer_rms_residual_ms:.3f} ms"
        )
        for note in (*report.fit_notes, *fit.notes):
            print(f"  note: {note}")
    c = report.costs
    print(
        f"embedding {c.embed_ms:.3f} ms (first stage), LM head {c.head_ms:.3f} ms + sampling "
        f"{c.sample_ms:.3f} ms (last stage), layers {sum(c.layer_ms):.3f} ms in all"
    )


def _print_table(report: RebalanceReport) -> None:
    """Each stage's layers and predicted ms now and proposed, beside what the run measured and KV capacity."""
    from rich.console import Console
    from rich.table import Table

    now, new = report.split.current, report.split.proposed
    virtual = report.training is not None and report.training.chunks > 1
    cols = ["virtual stage" if virtual else "stage", "layers now", "predicted ms now", "layers new", "predicted ms new"]
    measured = report.measured_stage_ms
    show_measured = measured is not None and len(measured) == len(now.split)
    caption = f"predicted ms: {report.stage_ms_statistic}"
    if show_measured:
        cols.insert(3, "measured ms now")  # what the last run's spans show, next to the predicted "ms now"
        caption += f"; measured ms: {report.measured_ms_statistic}"
    if now.kv_tokens is not None:
        cols += ["KV tokens now", "KV tokens new"]
    table = Table(title=f"objective: {report.split.objective}", caption=caption, caption_justify="left")
    for col in cols:
        table.add_column(col, justify="right")
    for s in range(len(new.split)):
        row = [str(s), str(now.split[s]), f"{now.stage_ms[s]:.3f}"]
        row += [f"{measured[s]:.3f}"] if show_measured and measured is not None else []
        row += [str(new.split[s]), f"{new.stage_ms[s]:.3f}"]
        if now.kv_tokens is not None and new.kv_tokens is not None:
            kv_now = f"{now.kv_tokens[s]:,}" if now.kv_tokens[s] >= 0 else "does not fit"
            row += [kv_now, f"{new.kv_tokens[s]:,}"]
        table.add_row(*row)
    Console().print(table)


def _print_verdict(report: RebalanceReport) -> None:
    """The predicted gain and its interval, keep or change, KV capacity, and the lines to paste."""
    from ppscope.balance.advise.rebalance import DEEPSPEED_NOTE
    from ppscope.balance.split import format_split

    now, new, iv = report.split.current, report.split.proposed, report.interval
    within = f" ({iv.level:.0%} interval, {iv.how}: {iv.low:.3f}–{iv.high:.3f})" if iv is not None else ""
    slowest = f"{now.bottleneck} at {now.max_ms:.3f} ms now, {new.bottleneck} at {new.max_ms:.3f} ms proposed"
    sim = report.simulated
    if sim is None:
        print(f"slowest stage: {slowest}: predicted speedup ×{report.split.predicted_speedup:.3f}{within}")
        if report.simulated_note:
            print(f"no schedule replay ({report.simulated_note}): the slowest stage's ratio leads")
    else:
        sure = f" ({iv.level:.0%} interval {iv.text()})" if iv is not None else ""
        host = f", host gaps ({sim.overhead_ms:.3f} ms an action)" if sim.overhead_ms > 0 else ""
        print(
            f"predicted speedup ×{sim.speedup:.3f}{sure}: both splits replayed on the run's schedule with its fill, "
            f"drain and hops ({sim.hop_latency_ns / 1e3:,.0f} µs){host}"
        )
        if iv is not None:
            print(f"  interval: {iv.how}")
        off = f"  the replay of the run as it is: {sim.error:.1%} off its measured time"
        print(
            off + (": the replay misses much of what the run spends, hence a wide interval" if sim.error > 0.25 else "")
        )
        print(
            f"  the slowest stage alone (closed form, no fill, drain or hops): {slowest}: "
            f"×{report.split.predicted_speedup:.3f}"
        )
    keep = not report.decision.change
    print(f"advice: {'KEEP the current split' if keep else 'change the split'}: {report.decision.reason}")
    lines = report.split.lines
    if now.kv_capacity is not None and new.kv_capacity is not None:
        print(f"pipeline KV capacity (smallest stage): {max(now.kv_capacity, 0):,} -> {new.kv_capacity:,} tokens")
    elif report.kv_bytes_per_token is not None:
        per = "; ".join(f"stage {s}: {b} B" for s, b in enumerate(report.kv_bytes_per_token))
        print(f"KV cache per token (proposed split): {per}; give --gpu-mem-gib for KV capacity")
    elif not report.has_model and report.training is None:  # a training run keeps no KV cache
        print("KV capacity: give --model and --gpu-mem-gib")
    if keep:
        print(f"the proposed split, not advised: {format_split(new.split)}")
        return
    print("ready to paste" + _JOB_NOTE[report.split.job] + ":")
    for key, label in _LINE_LABELS.items():
        if key in lines:
            print(f"  {label}{lines[key] or '(one stage: no flags needed)'}")
    if report.split.job == "deepspeed":
        print(f"  {DEEPSPEED_NOTE}")


_JOB_NOTE = {  # by JobKind
    "serving": " (a serving job)",
    "training": " (a training job)",
    "deepspeed": " (a DeepSpeed training job)",
    "unknown": " (nothing says whether the job serves or trains: the lines of both)",
}
_LINE_LABELS = {
    "vllm_env": "",
    "sglang_env": "",
    "megatron_args": "Megatron: ",
    "megatron_layout": "Megatron: ",
    "torchtitan_toml": "torchtitan ([parallelism] in the job's .toml): ",
    "torchtitan_args": "torchtitan: ",
    "ppscope_run": "",
}
