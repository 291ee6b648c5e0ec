"""The engine's command-line options and the one map from them to `EngineConfig`'s fields.

`OPTIONS` is the table: each option's flag, the field it sets (`section.field`), how its text becomes the
field's typed value, and what `--help` says. `add_engine_arguments` puts them on a parser (`ppscope run`,
`ppscope tune`; `ppscope demo` takes a few with `add_option`, under its own defaults), `engine_config` makes
the EngineConfig of a parsed command line (text is parsed here, once), and `in_flags` words a refusal that
names fields in the flags that set them. The engine is imported only inside `engine_config`, so `ppscope
--help` never loads it.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ppscope.balance.costs import parse_ms_list
from ppscope.balance.split import parse_counts
from ppscope.errors import ErrorCode, InvalidConfigError
from ppscope.trace.schedules import Schedule

if TYPE_CHECKING:
    from ppscope.cli.argtypes import Options
    from ppscope.engine.config import EngineConfig

__all__ = [
    "OPTIONS",
    "Option",
    "add_engine_arguments",
    "add_option",
    "engine_config",
    "in_flags",
    "option",
    "split_option",
]


def _same(value: object) -> object:
    return value


def split_option(text: str | None) -> tuple[int, ...] | None:
    """`--split` as the engine takes it: layer counts per stage, None when not given."""
    if text is None:
        return None
    if not text.strip():
        raise InvalidConfigError(
            ErrorCode.SPLIT_NOT_INTEGERS, f"--split {text!r} names no stage: give layer counts per stage, e.g. 1,7"
        )
    return tuple(parse_counts(text))


def _layer_costs(text: str) -> tuple[float, ...]:
    return tuple(parse_ms_list(text, "--layer-cost-ms"))


def _path(text: str | None) -> Path | None:
    return None if text is None else Path(text)


def _dir(text: str | None) -> Path | None:
    return Path(text) if text else None  # an empty --out is no --out: the default directory


@dataclass(frozen=True)
class Option:
    """One command-line option of the engine."""

    flag: str
    field: str
    """The EngineConfig field it sets: `section.field`."""
    group: str
    """The --help section it is listed in."""
    help: str
    type: Callable[[str], object] | None = None
    """argparse's conversion (int, float); text otherwise."""
    default: object = None
    """argparse's default: the field's default, as text where `parse` takes text."""
    parse: Callable[[Any], object] = _same
    """What argparse gave into the field's value (a split into a tuple of ints, ...)."""
    negate: bool = False
    """`--no-X`: given, the field is False."""

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--no-").removeprefix("--").replace("-", "_")

    def add_to(self, parser: Options, **changes: Any) -> None:
        """Add it to `parser` (or a group of one), with `changes` (default, help) to its settings."""
        if self.negate:
            parser.add_argument(
                self.flag, dest=self.dest, action=_GivenFalse, default=True, help=changes.get("help", self.help)
            )
            return
        settings = {"default": self.default, "help": self.help, **changes}
        kind: dict[str, Any] = {"type": self.type} if self.type else {}
        parser.add_argument(self.flag, dest=self.dest, action=_Given, **kind, **settings)


_GIVEN = "engine_flags_given"
"""The namespace attribute that lists the engine options given on the command line, which a --config file's
values yield to (a flag left at its default does not override the file)."""


class _Given(argparse.Action):
    """argparse's store, noting that the flag was given."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, _GIVEN, {*getattr(namespace, _GIVEN, ()), self.dest})


class _GivenFalse(_Given):
    """argparse's store_false (a `--no-X` flag), noting that the flag was given."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        super().__call__(parser, namespace, False, option_string)


OPTIONS: tuple[Option, ...] = (
    Option("--stages", "pipeline.stages", "pipeline", "pipeline stages = processes (default 2)", int, 2),
    Option(
        "--schedule",
        "pipeline.schedule",
        "pipeline",
        f"{' | '.join(Schedule.of_inference())} (default serve)",
        default=Schedule.SERVE.value,
    ),
    Option(
        "--microbatches",
        "pipeline.microbatches",
        "pipeline",
        "micro-batches per step, gpipe/interleaved (default: stages)",
        int,
        0,
    ),
    Option("--chunks", "pipeline.chunks", "pipeline", "model chunks per rank, interleaved (default 1)", int, 1),
    Option(
        "--max-inflight",
        "pipeline.max_inflight",
        "pipeline",
        "micro-batches in flight, serve (default: stages)",
        int,
        0,
    ),
    Option("--max-batch", "pipeline.max_batch", "pipeline", "requests per micro-batch, serve (default 1)", int, 1),
    Option(
        "--split",
        "pipeline.split",
        "pipeline",
        "layer counts per (virtual) stage, e.g. 5,4,4,3 (default: $PPSCOPE_PP_LAYER_PARTITION, else vLLM's rule)",
        parse=split_option,
    ),
    Option(
        "--backend", "runtime.backend", "pipeline", "auto | nccl | gloo (default auto: nccl with GPUs)", default="auto"
    ),
    Option(
        "--device",
        "runtime.device",
        "pipeline",
        "auto | cpu | cuda (default auto: the GPU with nccl, else the "
        "CPU; cuda with gloo runs ranks on GPUs, sharing one if need be, activations through host memory)",
        default="auto",
    ),
    Option(
        "--timeout",
        "runtime.timeout_s",
        "pipeline",
        "seconds a rank waits for a peer; a failure stops all within it (default 60)",
        float,
        60.0,
    ),
    Option(
        "--model",
        "model.name",
        "model",
        "preset (tiny, llama3-8b, ...), `synthetic`, or a Hugging Face Llama checkpoint directory (default tiny)",
        default="tiny",
    ),
    Option(
        "--dtype",
        "model.dtype",
        "model",
        "float32 | float64 | bfloat16 | float16, or fp32, fp64, bf16, fp16 (default float32)",
        default="float32",
    ),
    Option("--layers", "model.layers", "model", "synthetic model: decoder layers (default 8)", int, 8),
    Option(
        "--layer-cost-ms",
        "model.layer_cost_ms",
        "model",
        "synthetic: ms per layer, one value or one per layer",
        default="5",
        parse=_layer_costs,
    ),
    Option(
        "--emulate",
        "emulate.model",
        "model",
        "emulate GPU stages: every part of this model preset (e.g. llama3-8b) waits the time the cost model "
        "gives it on --gpu, scaled; sets the synthetic model (default: no emulation)",
        default="",
    ),
    Option(
        "--gpu", "emulate.gpu", "model", "with --emulate: the GPU it is timed on (default h100-sxm)", default="h100-sxm"
    ),
    Option(
        "--emulate-scale",
        "emulate.scale",
        "model",
        "with --emulate: factor on every modelled time (default 0: chosen so a stage's step takes about 30 ms)",
        float,
        0.0,
    ),
    Option("--embed-cost-ms", "model.embed_cost_ms", "model", "synthetic: ms of the embedding", float, 0.0),
    Option("--head-cost-ms", "model.head_cost_ms", "model", "synthetic: ms of the final norm + LM head", float, 0.0),
    Option(
        "--prompts",
        "workload.prompts",
        "requests",
        'JSONL file, one {"prompt_ids": [...], "max_new_tokens": n} a line',
        parse=_path,
    ),
    Option("--requests", "workload.requests", "requests", "generated requests (default 8)", int, 8),
    Option("--prompt-len", "workload.prompt_len", "requests", "generated prompt length (default 16)", int, 16),
    Option(
        "--max-new-tokens", "workload.max_new_tokens", "requests", "tokens to generate per request (default 8)", int, 8
    ),
    Option(
        "--rate", "workload.rate", "requests", "serve: Poisson arrivals per second (default 0: all at once)", float, 0.0
    ),
    Option("--temperature", "workload.temperature", "requests", "0 = greedy (default)", float, 0.0),
    Option("--top-p", "workload.top_p", "requests", "nucleus sampling threshold (default 1)", float, 1.0),
    Option("--seed", "workload.seed", "requests", "seeds weights, prompts, arrivals and sampling (default 0)", int, 0),
    Option("--out", "output.out", "output", "run directory (default runs/<timestamp>; never overwritten)", parse=_dir),
    Option("--no-record", "output.record", "output", "record nothing (overhead baseline)", negate=True),
    Option("--no-nvtx", "output.nvtx", "output", "record spans without NVTX ranges", negate=True),
    Option("--no-progress", "output.progress", "output", "no progress bar", negate=True),
    Option(
        "--layer-spans",
        "output.layer_spans",
        "output",
        "time each decoder layer of every K-th pass of each "
        "stage, the costs rebalance and tune use (default 8; 0 = never)",
        int,
        8,
    ),
)
_BY_FLAG = {o.flag: o for o in OPTIONS}
_BY_DEST = {o.dest: o for o in OPTIONS}
_FLAG_OF_FIELD = {o.field: o.flag for o in OPTIONS if not o.negate}
_DEST_OF_FIELD = {o.field: o.dest for o in OPTIONS}
_FIELD_NAMES = re.compile(
    r"(?<![\w.])(" + "|".join(re.escape(f) for f in sorted(_FLAG_OF_FIELD, key=len, reverse=True)) + r")(?!\w)"
)


def option(flag: str) -> Option:
    return _BY_FLAG[flag]


def add_engine_arguments(parser: argparse.ArgumentParser, *, out_help: str | None = None) -> None:
    """Every engine option, in --help sections (`out_help`: what --out means to this command), and --config."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="the run's config from a file: TOML in sections ([pipeline], [model], [workload], [output], "
        "[runtime]) of the fields `ppscope.engine.config` documents, or a run's meta.json to run it again (into a "
        "new directory); options given here override it",
    )
    groups: dict[str, Options] = {}
    for o in OPTIONS:
        if o.group not in groups:
            groups[o.group] = parser.add_argument_group(o.group)
        o.add_to(groups[o.group], **({"help": out_help} if o.flag == "--out" and out_help else {}))


def add_option(parser: argparse.ArgumentParser, flag: str, **changes: Any) -> None:
    """One engine option, with `changes` (default, help) to its settings."""
    _BY_FLAG[flag].add_to(parser, **changes)


def engine_config(args: argparse.Namespace, **given: object) -> EngineConfig:
    """The EngineConfig of the engine options in `args` (those its parser took; the rest keep their defaults),
    each parsed from its text here, with `given` (dest -> typed value) over them. A refusal names flags."""
    from ppscope.engine.config import EngineConfig, config_fields

    values = {o.field: o.parse(getattr(args, o.dest)) for o in OPTIONS if hasattr(args, o.dest)}
    if getattr(args, "config", None):
        flags: set[str] = getattr(args, _GIVEN, set())
        given_here = {f: v for f, v in values.items() if _DEST_OF_FIELD[f] in flags}
        values = {**values, **config_fields(args.config), **given_here}
    values.update({_BY_DEST[dest].field: value for dest, value in given.items()})
    try:
        return EngineConfig.from_fields(values)
    except InvalidConfigError as exc:
        raise type(exc)(exc.code, in_flags(str(exc))) from None


def in_flags(message: str) -> str:
    """`message` with each field an option sets (`pipeline.microbatches`) named by its flag (`--microbatches`)."""
    return _FIELD_NAMES.sub(lambda m: _FLAG_OF_FIELD[m.group(1)], message)
