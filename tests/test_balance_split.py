"""Layer splits: parsing, validation messages, vLLM's default rule, and where a split comes from."""

from __future__ import annotations

import pytest
from error_helpers import raises_code
from hypothesis import given
from hypothesis import strategies as st

from ppscope.balance.split import (
    ENV_VAR,
    boundaries_as_counts,
    parse_counts,
    parse_split,
    resolve_split,
    stage_layer_ranges,
    validate_split,
    vllm_default_split,
)
from ppscope.errors import ErrorCode, InvalidSplitError


def test_parse_split_accepts_counts_and_spaces() -> None:
    assert parse_split("5, 4,4 ,3", 16) == [5, 4, 4, 3]
    assert parse_split("16", 16, 1) == [16]


@pytest.mark.parametrize(
    ("text", "layers", "stages", "code", "names"),
    [  # what the message names: the split, and the counts to give where it can tell them
        ("5,4,4", 16, None, ErrorCode.SPLIT_DOES_NOT_COVER_LAYERS, ("5,4,4",)),
        ("9,4,4", 16, None, ErrorCode.SPLIT_DOES_NOT_COVER_LAYERS, ("9,4,4",)),
        ("4,8", 8, None, ErrorCode.SPLIT_LOOKS_LIKE_BOUNDS, ("4,8", "4,4")),
        ("20,40,60,80", 80, 4, ErrorCode.SPLIT_LOOKS_LIKE_BOUNDS, ("20,20,20,20",)),
        ("8,4", 8, None, ErrorCode.SPLIT_DOES_NOT_COVER_LAYERS, ("8,4",)),
        ("8,8", 16, 4, ErrorCode.SPLIT_STAGE_COUNT, ("8,8",)),
        ("16,0", 16, None, ErrorCode.SPLIT_EMPTY_STAGE, ("16,0",)),
        ("a,b", 16, None, ErrorCode.SPLIT_NOT_INTEGERS, ("'a,b'",)),
        ("4,,4", 8, None, ErrorCode.SPLIT_NOT_INTEGERS, ("'4,,4'",)),
        ("", 8, None, ErrorCode.SPLIT_NOT_INTEGERS, ()),
    ],
)
def test_invalid_splits_say_what_is_wrong(
    text: str, layers: int, stages: int | None, code: ErrorCode, names: tuple[str, ...]
) -> None:
    with raises_code(InvalidSplitError, code) as info:
        parse_split(text, layers, stages)
    assert all(name in str(info.value) for name in names), str(info.value)


@given(st.lists(st.integers(1, 40), min_size=2, max_size=8))
def test_boundaries_read_back_as_the_counts_they_bound(counts: list[int]) -> None:
    ends = [sum(counts[: i + 1]) for i in range(len(counts))]
    assert boundaries_as_counts(ends, sum(counts)) == counts
    assert boundaries_as_counts(ends, sum(counts) + 1) is None


def test_vllm_default_matches_its_rule() -> None:
    # vLLM: floor(L/P) each, remainder one each from the second-to-last stage backwards.
    assert vllm_default_split(32, 4) == [8, 8, 8, 8]
    assert vllm_default_split(10, 4) == [2, 3, 3, 2]
    assert vllm_default_split(11, 4) == [3, 3, 3, 2]
    assert vllm_default_split(7, 2) == [4, 3]
    with raises_code(InvalidSplitError, ErrorCode.TOO_FEW_LAYERS):
        vllm_default_split(3, 4)


@given(st.integers(1, 200), st.integers(1, 16))
def test_default_split_covers_every_layer_once(layers: int, stages: int) -> None:
    if layers < stages:
        return
    split = vllm_default_split(layers, stages)
    validate_split(split, layers, stages)
    assert max(split) - min(split) <= 1
    assert split[-1] == layers // stages
    ranges = stage_layer_ranges(split)
    covered = [layer for start, end in ranges for layer in range(start, end)]
    assert covered == list(range(layers))


def test_resolve_split_order_cli_env_default() -> None:
    env = {ENV_VAR: "3,5"}
    assert resolve_split((6, 2), 8, 2, env) == ([6, 2], "--split")
    assert resolve_split(None, 8, 2, env) == ([3, 5], ENV_VAR)
    assert resolve_split(None, 8, 2, {}) == ([4, 4], "vllm-default")
    with raises_code(InvalidSplitError, ErrorCode.SPLIT_DOES_NOT_COVER_LAYERS) as err:
        resolve_split(None, 8, 2, {ENV_VAR: "3,4"})
    assert ENV_VAR in str(err.value)  # where the bad split came from


def test_counts_are_parsed_as_text_alone() -> None:
    assert parse_counts(" 3, 5") == [3, 5] and parse_counts("0,9") == [0, 9]  # the model is not known yet
    with raises_code(InvalidSplitError, ErrorCode.SPLIT_NOT_INTEGERS):
        parse_counts("1,,7", "1,7")


def test_a_given_split_is_checked_against_the_model_when_resolved() -> None:
    with raises_code(InvalidSplitError, ErrorCode.SPLIT_DOES_NOT_COVER_LAYERS):
        resolve_split((3, 3), 8, 2, {})
