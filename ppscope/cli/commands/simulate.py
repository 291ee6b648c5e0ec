"""`ppscope simulate`: predict a pipeline's timeline for a schedule, split and cost model."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any, TypedDict

from ppscope.cli.cost_options import add_cost_arguments, given_costs
from ppscope.trace.schedules import Schedule

if TYPE_CHECKING:
    from ppscope.cli.argtypes import Subcommands
    from ppscope.simulate.calibrate import Prediction, Replay
    from ppscope.simulate.simulator import SimConfig

HELP = "Predict a pipeline's timeline for a schedule, split and cost model"
EXAMPLE = (
    "ppscope simulate --schedule gpipe --stages 4 --microbatches 8 --layers 16 --layer-cost-ms 1 "
    "--head-cost-ms 3 --out runs/sim1"
)

_DESCRIPTION = (
    f"{HELP}. A discrete-event simulation of the schedule's actions with the given costs (ms per micro-batch "
    "pass) and a comm model (latency + bytes ÷ bandwidth per hop) writes a predicted run directory in the same "
    "schema as a measured one: analyze, export and the dashboard read it unchanged."
)


def register(sub: Subcommands) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "simulate", help=HELP, description=_DESCRIPTION, epilog=f"example: {EXAMPLE}"
    )
    p.add_argument(
        "--from",
        dest="from_run",
        metavar="RUN",
        help="replay a measured run: its schedule, sizes and split, costs fitted from its spans, hop latency and "
        "host overhead from its gaps (add --split to ask what another split would do)",
    )
    p.add_argument("--schedule", choices=[s.value for s in Schedule.of_inference()], help="the schedule (gpipe)")
    p.add_argument("--stages", type=int, help="ranks (physical pipeline stages)")
    p.add_argument("--microbatches", type=int, help="micro-batches (serve: micro-batches in flight)")
    p.add_argument("--chunks", type=int, help="model chunks per rank (interleaved) (1)")
    p.add_argument("--steps", type=int, help="passes per micro-batch: 1 prefill + decode steps (1)")
    add_cost_arguments(p)
    p.add_argument("--split", help="layer counts per (virtual) stage (default: vLLM's rule)")
    p.add_argument("--overhead-ms", type=float, default=0.0, help="host time per action, outside any span")
    p.add_argument("--speeds", help="relative speed of each rank's device, comma-separated")
    p.add_argument("--prefill-factor", type=float, default=1.0, help="cost of a step-0 pass relative to decode")
    p.add_argument("--comm-latency-us", type=float, default=0.0, help="latency per hop, µs")
    p.add_argument(
        "--comm-gb-per-s",
        type=float,
        default=0.0,
        help="link bandwidth, GB/s (gigabytes: 400 Gbit/s InfiniBand is 50) (0: unlimited)",
    )
    p.add_argument("--activation-bytes", type=int, default=0, help="bytes one micro-batch sends to the next stage")
    p.add_argument("--out", required=True, metavar="RUN_DIR", help="where to write the predicted run (must be new)")
    p.add_argument("--json", action="store_true", help="print one JSON object (keys documented in the README)")
    p.set_defaults(func=run)


def _replay(args: argparse.Namespace) -> tuple[Replay, Prediction]:
    """The replay of --from RUN and its prediction with --split (the run's own split without)."""
    from ppscope.balance.split import parse_split
    from ppscope.errors import ErrorCode, InvalidConfigError
    from ppscope.formats.sources import open_trace
    from ppscope.simulate.calibrate import Replay

    taken = (
        ("--schedule", args.schedule),
        ("--stages", args.stages),
        ("--microbatches", args.microbatches),
        ("--chunks", args.chunks),
        ("--steps", args.steps),
        ("--layers", args.layers),
        ("--layer-costs", args.layer_costs),
    )
    given = [o for o, v in taken if v is not None]
    if given:
        raise InvalidConfigError(
            ErrorCode.CONFLICTING_OPTIONS,
            f"--from RUN replays the run's own schedule, sizes and costs: drop {', '.join(given)} (or simulate "
            "without --from)",
        )
    replay = Replay.of(open_trace(args.from_run))
    cfg = replay.config
    split = parse_split(args.split, cfg.costs.layers, len(cfg.split)) if args.split else None
    return replay, replay.predict(split)


class _Measured(TypedDict):
    """`simulate --from RUN --json`'s `measured`: the run replayed against what it measured, and the split asked
    about against the replay."""

    run_dir: str
    split: list[int]
    measured_ms: float
    replay_ms: float
    replay_throughput_error: float
    predicted_ms: float
    predicted_speedup: float | None


def run(args: argparse.Namespace) -> int:
    from ppscope.simulate.simulator import simulate, summarize, write_run
    from ppscope.trace.outputs import check_output

    check_output(args.out, kind="run", inputs=[args.from_run] if args.from_run else [])
    measured: _Measured | None = None
    if args.from_run:
        replay, prediction = _replay(args)
        cfg, trace = prediction.config, prediction.trace
        own = prediction if tuple(cfg.split) == tuple(replay.config.split) else replay.predict()
        measured = {
            "run_dir": args.from_run,
            "split": list(replay.measured.meta.split),
            "measured_ms": own.measured_ms,
            "replay_ms": own.predicted_ms,
            "replay_throughput_error": own.throughput_error,
            "predicted_ms": prediction.predicted_ms,
            "predicted_speedup": own.predicted_ms / prediction.predicted_ms if prediction.predicted_ms else None,
        }
    else:
        cfg = _config(args)
        trace = simulate(cfg)
    path = write_run(trace, args.out)
    summary = {"run_dir": str(path), **summarize(cfg, trace)}
    if measured is not None:
        summary["measured"] = measured
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    _print(cfg, summary)
    return 0


def _config(args: argparse.Namespace) -> SimConfig:
    from ppscope.balance.costs import parse_ms_list
    from ppscope.balance.split import parse_split
    from ppscope.errors import ErrorCode, InvalidConfigError
    from ppscope.simulate.simulator import CommModel, SimConfig

    if args.stages is None or args.microbatches is None:
        raise InvalidConfigError(
            ErrorCode.MISSING_OPTION, "give --stages P and --microbatches M (or --from RUN to replay a run)"
        )
    costs = given_costs(args).resolve(
        missing="give the costs: --layer-costs MS,MS,... (one per layer) or --layers N --layer-cost-ms MS"
    )
    chunks = args.chunks or 1
    virtual = args.stages * chunks
    return SimConfig(
        schedule=args.schedule or Schedule.GPIPE.value,
        stages=args.stages,
        microbatches=args.microbatches,
        chunks=chunks,
        steps=args.steps or 1,
        costs=costs,
        split=tuple(parse_split(args.split, costs.layers, virtual)) if args.split else (),
        overhead_ms=args.overhead_ms,
        speed=tuple(parse_ms_list(args.speeds, "--speeds")) if args.speeds else (),
        prefill_factor=args.prefill_factor,
        comm=CommModel(
            latency_us=args.comm_latency_us,
            bandwidth_gb_per_s=args.comm_gb_per_s,
            activation_bytes=args.activation_bytes,
        ),
    )


def _print(cfg: SimConfig, summary: dict[str, Any]) -> None:
    path = summary["run_dir"]
    m = summary.get("measured")
    print(
        f"{cfg.schedule}: {cfg.stages} stage(s), {cfg.microbatches} micro-batch(es)"
        + (f", {cfg.chunks} chunks" if cfg.chunks > 1 else "")
        + f", {cfg.steps} step(s), split {','.join(map(str, summary['split']))}"
    )
    theory = summary["theory_bubble_ratio"]
    timing = "" if m is not None else f"makespan {summary['makespan_ms']:.3f} ms; "  # with --from: the lines below
    print(
        f"{timing}{summary['passes_per_s']:.1f} micro-batch passes/s; bubble ratio {summary['bubble_ratio']:.1%} "
        "(Σ idle / (P × window), as `ppscope analyze` reports it)"
        + (f"; theory {theory:.1%} = {summary['theory_formula']}" if theory is not None else "")
    )
    busy = ", ".join(f"{b:.3f}" for b in summary["busy_ms_per_rank"])
    print(f"busy per rank (ms): {busy}")
    if m is not None:
        own = ",".join(map(str, m["split"]))
        print(
            f"replay of {m['run_dir']} (split {own}): simulated {m['replay_ms']:.3f} ms against measured "
            f"{m['measured_ms']:.3f} ms: the simulator's throughput error on this run is "
            f"{m['replay_throughput_error']:+.1%}"
        )
        if m["split"] != summary["split"]:
            print(
                f"split {','.join(map(str, summary['split']))}: simulated {m['predicted_ms']:.3f} ms, predicted "
                f"speedup ×{m['predicted_speedup']:.3f} against the replay of split {own} (both simulated; the "
                "error above is how far the simulator was off on the run itself)"
            )
    print(f"wrote {path}: inspect it with `ppscope analyze {path}`")
