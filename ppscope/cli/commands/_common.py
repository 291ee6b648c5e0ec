"""Helpers shared by the subcommands: argument types and the placeholder for commands not built yet."""

from __future__ import annotations

import argparse
from typing import Any

from ppscope.errors import NotBuiltError

__all__ = ["add_planned", "not_built"]


def not_built(name: str, what: str) -> Any:
    def run(args: argparse.Namespace) -> int:
        raise NotBuiltError(f"`ppscope {name}` is not built yet; see the README for what works today")

    return run


def add_planned(sub: Any, name: str, help_text: str, example: str) -> argparse.ArgumentParser:
    """A subcommand that exists in --help but says it is not built yet, in one line, exit 2."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=f"{help_text} (not built yet)",
        description=f"{help_text}. Not built yet.",
        epilog=f"example: {example}",
    )
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(func=not_built(name, help_text.lower()), planned=True)
    return parser
