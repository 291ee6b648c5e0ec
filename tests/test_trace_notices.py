"""Warnings are data: a code that says which case, the sentence that says it, and one place declaring the codes."""

from __future__ import annotations

import ast
import itertools
import json
import re
from pathlib import Path

from ppscope.analysis import analyze
from ppscope.trace.model import RunMeta, Trace
from ppscope.trace.notices import Notice, NoticeCode


def test_a_notice_prints_as_its_text_and_carries_its_code_in_json() -> None:
    n = Notice(NoticeCode.ONE_STAGE, "one stage only")
    assert str(n) == f"{n}" == "one stage only"
    assert json.dumps(n.to_json()) == '{"code": "one_stage", "text": "one stage only"}'


def test_every_code_is_snake_case_distinct_and_documented() -> None:
    values = [c.value for c in NoticeCode]
    assert len(set(values)) == len(values)
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", v) for v in values)
    source = Path(__file__).parents[1] / "ppscope" / "trace" / "notices.py"
    (enum,) = [n for n in ast.parse(source.read_text()).body if isinstance(n, ast.ClassDef) and n.name == "NoticeCode"]
    body = enum.body
    documented = {
        target.id
        for stmt, after in itertools.pairwise(body)
        if isinstance(stmt, ast.Assign)
        for target in stmt.targets
        if isinstance(target, ast.Name)
        and isinstance(after, ast.Expr)
        and isinstance(after.value, ast.Constant)
        and isinstance(after.value.value, str)
    }
    assert documented == {c.name for c in NoticeCode}


def test_the_analysis_json_carries_codes_where_it_carried_sentences() -> None:
    rows = [{"rank": 0, "stage": 0, "kind": "forward", "mb": 0, "start_ns": 0, "end_ns": 10}]
    got = analyze(Trace.from_records(rows, meta=RunMeta(world_size=2, pp_size=2))).to_json()
    assert got["missing"]["code"] == "missing_ranks" and got["missing"]["text"].startswith("rank 1 ")
    assert {
        "code": "one_stage",
        "text": "one stage only: there is no pipeline; the bubble is that stage's idle time",
    } in (got["warnings"])
