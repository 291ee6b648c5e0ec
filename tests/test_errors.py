"""`brief`: a library's exception quoted inside a ppscope error, on one line and short."""

from __future__ import annotations

import sqlite3

from ppscope.errors import brief


def test_a_message_over_lines_becomes_one_line_with_single_spaces() -> None:
    exc = sqlite3.DatabaseError('malformed database schema (spans) -\n  near "(":\tsyntax error')
    assert brief(exc) == 'malformed database schema (spans) - near "(": syntax error'


def test_a_long_message_is_cut_to_the_limit_with_an_ellipsis() -> None:
    assert brief(ValueError("x" * 300)) == "x" * 199 + "…"
    assert len(brief(ValueError("ab cd ef"), limit=5)) == 5 and brief(ValueError("ab cd ef"), limit=5) == "ab c…"
    assert brief(ValueError("y" * 200)) == "y" * 200  # at the limit: kept whole
