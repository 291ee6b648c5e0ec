"""Tests of ppscope's errors by their type and their code, never by their message's words.

`raises_code` for a library call; `cli_error` for a command, through its `--json` where it has one.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple
from unittest import mock

import pytest

from ppscope.cli import main as cli
from ppscope.errors import ErrorCode, PPScopeError


@contextmanager
def raises_code(error: type[PPScopeError], code: ErrorCode) -> Iterator[pytest.ExceptionInfo[PPScopeError]]:
    """`pytest.raises(error)` that also checks the error's code: a message can be reworded freely."""
    with pytest.raises(error) as info:
        yield info
    assert info.value.code == code, f"{info.value.code} ({info.value}), expected {code}"


class CliError(NamedTuple):
    """How a command failed."""

    exit_code: int
    code: ErrorCode
    text: str
    """The error's message: test what it names (a path, a rank, the valid choices) with `in`, not its words."""
    err: str
    """All the command wrote to stderr (the message is its one line, after notes, if any)."""


def cli_error(capsys: pytest.CaptureFixture[str], argv: Sequence[str]) -> CliError:
    """Run `ppscope ARGV`, which must fail with a ppscope error, and say how.

    A command with `--json` runs with it, and the code is the one its JSON on stdout gives; a command without
    (`export`, `dashboard`, `watch`) runs as it is, and the code is that of the error it raised."""
    command = argv[0]
    if "--json" in cli._command_parser(cli.build_parser(), command)._option_string_actions:
        exit_code = cli.main([*argv, "--json"])
        captured = capsys.readouterr()
        assert exit_code != 0, f"ppscope {command} did not fail: {captured.err}"
        error = json.loads(captured.out)["error"]
        return CliError(exit_code, ErrorCode(error["code"]), error["text"], captured.err)
    raised: list[PPScopeError] = []
    parse_args = cli.parse_args

    def parse_and_watch(parser: argparse.ArgumentParser, args_in: Sequence[str] | None) -> argparse.Namespace:
        args = parse_args(parser, args_in)
        func = args.func

        def watched(ns: argparse.Namespace) -> object:
            try:
                return func(ns)
            except PPScopeError as exc:
                raised.append(exc)
                raise

        args.func = watched
        return args

    with mock.patch.object(cli, "parse_args", parse_and_watch):
        exit_code = cli.main(list(argv))
    captured = capsys.readouterr()
    assert raised, f"ppscope {command} did not fail with a ppscope error: {captured.err}"
    return CliError(exit_code, raised[0].code, str(raised[0]), captured.err)
