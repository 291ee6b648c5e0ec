"""`ppscope analyze`: report bubbles, their causes and the bottleneck stage of a run or an nsys/Kineto trace."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ppscope.analysis.analyzer import AnalysisConfig
    from ppscope.analysis.placement import Placement
    from ppscope.analysis.replicas import ReplicaAnalysis
    from ppscope.analysis.result import AnalysisResult
    from ppscope.cli.argtypes import Subcommands
    from ppscope.trace.model import Trace
    from ppscope.trace.notices import Notice

HELP = "Report bubbles, their causes and the bottleneck stage of a run or an nsys/Kineto trace"
EXAMPLE = "ppscope analyze runs/r1 --steady --html report.html"

_STAGE_OF_RANK_HELP = (
    "which stage each rank runs, for a job of data-parallel pipelines: ranges RANKS:STAGE (0-7:0,8-15:1), or a "
    "rule rank//N (stage-major: ranks 0..N-1 run stage 0), rank%%N (replica-major: ranks 0..N-1 are one "
    "pipeline) or rank//N%%M; within a stage, ranks in order form replica 0, 1, ... (--tp ranks each). Default: "
    "the run's metadata (RankInfo.replica), or Kineto's distributedInfo process groups"
)
_DESCRIPTION = (
    f"{HELP}. The bubble ratio is Σ bubble / (P × window), the share of the P stages' wall time spent idle. "
    "--steady finds the steady state automatically: from the instant every stage has started computing to the "
    "instant the first stage finishes its last compute."
)


def register(sub: Subcommands) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "analyze", help=HELP, description=_DESCRIPTION, epilog=f"example: {EXAMPLE}"
    )
    p.add_argument("run", metavar="RUN", help="a ppscope run directory, an nsys .sqlite export or a Kineto trace")
    win = p.add_mutually_exclusive_group()
    win.add_argument("--steady", action="store_true", help="analyse the steady state only (found automatically)")
    win.add_argument(
        "--active", action="store_true", help="analyse from the first compute of any stage to the last (no start-up)"
    )
    win.add_argument(
        "--window", metavar="START_MS:END_MS", help="analyse this window, in ms from the trace's first span"
    )
    p.add_argument("--stage-of-rank", metavar="SPEC", help=_STAGE_OF_RANK_HELP)
    p.add_argument(
        "--tp",
        type=int,
        default=1,
        metavar="N",
        help="with --stage-of-rank: ranks per stage per replica (tensor parallel), analysed together as one stage",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (keys documented in the README)")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report to FILE (a new file)")
    p.add_argument("--force", action="store_true", help="replace an existing --html FILE")
    p.add_argument(
        "--max-bars", type=int, default=20_000, help="most bars in the HTML Gantt chart (neighbours merged above it)"
    )
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="read a run directory a rank at a time in N processes (1: this one), so memory holds one stage's spans "
        "per worker, not the whole job; the same figures to the nanosecond",
    )
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="do --workers' per-rank work as tasks of the Ray cluster at ADDRESS (`local`: start one here); every "
        "node must see RUN at the same path. Needs pip install 'ppscope[cluster]'",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ppscope.analysis import AnalysisConfig, analyze, parse_window_ms
    from ppscope.analysis.placement import apply_placement, parse_stage_of_rank, placement_of
    from ppscope.analysis.report import print_report, stdout_console, write_html
    from ppscope.errors import ErrorCode, InvalidConfigError, UnsupportedInputError
    from ppscope.formats.sources import open_trace
    from ppscope.trace.outputs import check_output

    if args.max_bars < 1:
        raise InvalidConfigError(ErrorCode.BAD_VALUE, f"--max-bars must be >= 1, got {args.max_bars}")
    window_ms = parse_window_ms(args.window) if args.window else None
    config = AnalysisConfig(steady=args.steady, active=args.active, window_ms=window_ms)
    if args.html:  # before the analysis: a refused --html costs nothing
        check_output(args.html, option="--html", inputs=[args.run], force=args.force)
    if args.tp != 1 and not args.stage_of_rank:
        raise InvalidConfigError(
            ErrorCode.CONFLICTING_OPTIONS, "--tp needs --stage-of-rank (the metadata's ranks already say their replica)"
        )
    if args.workers is not None or args.ray is not None:
        ranked = _rank_by_rank(args, config)
        if isinstance(ranked, int):
            return ranked
        result, unrecorded, said = ranked
    else:
        from ppscope.simulate.training import is_training, replay_training
        from ppscope.simulate.whatif import what_if

        trace = open_trace(args.run)
        placement = placement_of(
            trace, parse_stage_of_rank(args.stage_of_rank) if args.stage_of_rank else None, args.tp
        )
        if placement is not None:
            trace = apply_placement(trace, placement)
            if len(placement.replicas) > 1:
                return _replicas(args, trace, placement, config)
        result = analyze(trace, config)
        unrecorded, said = trace.meta.unrecorded, trace.warnings
        if result.stages and is_training(trace):  # the run's own action order, replayed with its measured costs
            result.replay, _ = replay_training(trace)
        if result.stages:  # and with changed costs
            result.what_if, result.what_if_reason = what_if(trace, placement)
    if not result.stages and not unrecorded:
        why = "; ".join(map(str, said)) or "did the run record anything?"
        raise UnsupportedInputError(ErrorCode.NO_SPANS, f"{args.run} holds no spans: nothing to analyse ({why})")
    if args.html:
        path = write_html(result, args.html, trace, max_bars=args.max_bars, force=args.force)
        if not args.json:
            print(f"wrote {path}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print_report(result, stdout_console())
    return 0


def _rank_by_rank(args: argparse.Namespace, config: AnalysisConfig) -> tuple[AnalysisResult, bool, list[Notice]] | int:
    """`--workers`, `--ray`: the run directory analysed a rank, then a stage, at a time
    (`ppscope.analysis.sharded`); a job of several replicas, each on its own, printed here (then the exit
    code is returned)."""
    from ppscope.analysis.placement import parse_stage_of_rank
    from ppscope.analysis.sharded import analyze_run
    from ppscope.analysis.sharded_replicas import analyze_run_replicas
    from ppscope.errors import ErrorCode, InvalidConfigError
    from ppscope.simulate.whatif import unread_reason
    from ppscope.trace.notices import NoticeCode
    from ppscope.trace.store import is_run_dir, read_meta

    how = "--ray" if args.ray is not None else "--workers"
    if args.html:
        raise InvalidConfigError(
            ErrorCode.CONFLICTING_OPTIONS,
            f"--html draws every span, so it needs the whole trace in memory: leave out {how}",
        )
    if not is_run_dir(args.run):
        raise InvalidConfigError(
            ErrorCode.CONFLICTING_OPTIONS,
            f"{how} reads a ppscope run directory rank by rank, and {args.run} is not one: leave out {how}",
        )
    rule = parse_stage_of_rank(args.stage_of_rank) if args.stage_of_rank else None
    ra = analyze_run_replicas(args.run, rule, args.tp, config, workers=args.workers or 1, ray=args.ray)
    if ra is not None:
        _shown(args, ra).what_if_reason = unread_reason(read_meta(args.run))
        return _print_replicas(args, ra)
    result = analyze_run(args.run, config, workers=args.workers or 1, ray=args.ray, gaps=False)  # no drawing
    said = [w for w in result.warnings if w.code != NoticeCode.NO_SPANS]  # the error says it
    meta = read_meta(args.run)
    if result.stages:
        result.what_if_reason = unread_reason(meta)
    return result, meta.unrecorded, said


def _replicas(args: argparse.Namespace, trace: Trace, placement: Placement, config: AnalysisConfig) -> int:
    """A job of several data-parallel pipelines: each analysed on its own, compared stage by stage; the
    pipeline holding the bottleneck is detailed as one pipeline is."""
    from ppscope.analysis.replicas import analyze_replicas, replica_trace
    from ppscope.analysis.report import write_html
    from ppscope.simulate.whatif import what_if

    ra = analyze_replicas(trace, placement, config, keep_gaps=bool(args.html))
    result = _shown(args, ra)
    result.what_if, result.what_if_reason = what_if(trace, placement)  # the job's, every replica's
    if args.html:
        sub = replica_trace(trace, placement, ra.shown_replica)
        path = write_html(result, args.html, sub, max_bars=args.max_bars, force=args.force)
        if not args.json:
            print(f"wrote {path} (replica {ra.shown_replica})", file=sys.stderr)
    return _print_replicas(args, ra)


def _shown(args: argparse.Namespace, ra: ReplicaAnalysis) -> AnalysisResult:
    """The result of the replica the report details; a one-line error when no replica recorded anything."""
    from ppscope.errors import ErrorCode, UnsupportedInputError

    result = ra.results.get(ra.shown_replica)
    if result is None or not result.stages:
        why = "; ".join(map(str, ra.warnings)) or "did the run record anything?"
        raise UnsupportedInputError(
            ErrorCode.NO_SPANS, f"{args.run} holds no spans of any replica: nothing to analyse ({why})"
        )
    return result


def _print_replicas(args: argparse.Namespace, ra: ReplicaAnalysis) -> int:
    """The replicas compared stage by stage, then the pipeline holding the bottleneck in full."""
    from ppscope.analysis.replica_report import replica_json, replica_lines
    from ppscope.analysis.report import print_report, stdout_console

    result = _shown(args, ra)
    if args.json:
        print(json.dumps(replica_json(ra), indent=2))
        return 0
    print("\n".join(replica_lines(ra)))
    for warning in ra.warnings:
        print(f"warning: {warning}")
    print(f"\nreplica {ra.shown_replica}, the pipeline holding the bottleneck:")
    result.warnings = ra.replica_warnings.get(ra.shown_replica, [])  # the job's were said above
    print_report(result, stdout_console())
    return 0
