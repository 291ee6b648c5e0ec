"""The `ppscope` command: parse, call one library function, print. Named errors become one line (and, under
`--json`, also one JSON object on stdout with the error's code: `{"error": {"code": ..., "text": ...}}`).

Each subcommand lives in `ppscope/cli/commands/<name>.py` with `register(subparsers)`; command modules import
their heavy dependencies (pandas, torch, streamlit) inside the command, so `ppscope --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

from ppscope import __version__
from ppscope.errors import PPScopeError

__all__ = ["COMMANDS", "build_parser", "main", "parse_args"]

COMMANDS = ("run", "analyze", "rebalance", "simulate", "plan", "tune", "export", "dashboard", "watch", "demo")

_DESCRIPTION = (
    "Measure the bubbles of a pipeline-parallel LLM deployment, find the bottleneck stage, and get the "
    "layer split that removes it."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ppscope", description=_DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"ppscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"ppscope.cli.commands.{name}").register(sub)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse; an unknown option is reported with the usage of the command it was given to, not the top level's."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        _command_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:  # argparse keeps no public handle on its subcommands' parsers
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices.get(command, parser)
            return found
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:  # a Ctrl-C while the commands load is an interruption like any other, not a traceback
        parser = build_parser()
    except KeyboardInterrupt:
        print("ppscope: interrupted", file=sys.stderr)
        return 130
    args = parse_args(parser, argv)
    try:
        code = args.func(args)
    except PPScopeError as exc:
        print(f"ppscope {args.command}: error: {exc}", file=sys.stderr)
        if getattr(args, "json", False) is True:  # a program reading --json learns which case it is by its code
            print(json.dumps({"error": exc.to_json()}))
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"ppscope {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `ppscope analyze run | head`
        return 0
    return int(code or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
