"""ppscope's errors: each made with its code (`ErrorCode`, every one documented), and `brief`, a library's
exception quoted inside a ppscope error, on one line and short."""

from __future__ import annotations

import ast
import itertools
import pickle
import re
import sqlite3
from pathlib import Path

from ppscope.errors import CorruptFileError, ErrorCode, PPScopeError, brief

ROOT = Path(__file__).resolve().parents[1]


def test_a_message_over_lines_becomes_one_line_with_single_spaces() -> None:
    exc = sqlite3.DatabaseError('malformed database schema (spans) -\n  near "(":\tsyntax error')
    assert brief(exc) == 'malformed database schema (spans) - near "(": syntax error'


def test_a_long_message_is_cut_to_the_limit_with_an_ellipsis() -> None:
    assert brief(ValueError("x" * 300)) == "x" * 199 + "…"
    assert len(brief(ValueError("ab cd ef"), limit=5)) == 5 and brief(ValueError("ab cd ef"), limit=5) == "ab c…"
    assert brief(ValueError("y" * 200)) == "y" * 200  # at the limit: kept whole


def _subclasses(cls: type) -> set[str]:
    return {cls.__name__}.union(*(_subclasses(sub) for sub in cls.__subclasses__()))


def _is_code(node: ast.expr) -> bool:
    """`ErrorCode.NAME` of a member, `ErrorCode(text)`, or `exc.code` (a wrapper keeping the wrapped error's)."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ErrorCode":
        return node.attr in ErrorCode.__members__
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "ErrorCode":
        return True
    return isinstance(node, ast.Attribute) and node.attr == "code"


def test_every_ppscope_error_is_made_with_a_code() -> None:
    """Each `SomeError(...)` in the package passes its `ErrorCode` first, then the message."""
    names = _subclasses(PPScopeError)
    assert {"InvalidSplitError", "WorkerFailedError"} <= names
    lacking = []
    for path in sorted((ROOT / "ppscope").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in names and not (len(node.args) == 2 and _is_code(node.args[0])):
                lacking.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert not lacking, f"errors made without an ErrorCode first: {lacking}"


def test_every_code_is_snake_case_and_documented() -> None:
    """Each member's value is its name in lower case, and a docstring under it says what case it is."""
    for code in ErrorCode:
        assert code.value == code.name.lower() and re.fullmatch(r"[a-z]+(_[a-z]+)*", code.value), code
    body = next(
        n
        for n in ast.parse((ROOT / "ppscope" / "errors.py").read_text()).body
        if isinstance(n, ast.ClassDef) and n.name == "ErrorCode"
    ).body
    documented = {
        stmt.targets[0].id
        for stmt, after in itertools.pairwise(body)
        if isinstance(stmt, ast.Assign)
        and isinstance(stmt.targets[0], ast.Name)
        and isinstance(after, ast.Expr)
        and isinstance(after.value, ast.Constant)
        and isinstance(after.value.value, str)
    }
    assert set(ErrorCode.__members__) - documented == set()


def test_an_error_keeps_its_code_and_message_across_processes() -> None:
    exc = CorruptFileError(ErrorCode.NOT_SQLITE, "rank-00001.sqlite is not an SQLite file")
    exc.path = Path("rank-00001.sqlite")
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is CorruptFileError and back.code == ErrorCode.NOT_SQLITE and back.path == exc.path
    assert str(back) == str(exc) and back.to_json() == {"code": "not_sqlite", "text": str(exc)}
