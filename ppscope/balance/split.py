"""Layer splits: how many decoder layers each pipeline stage holds, in the format engines take.

A split is a list of layer counts per stage, the same format and meaning as vLLM's
`VLLM_PP_LAYER_PARTITION` (length = stages, sum = layers, every entry >= 1). This module parses, validates
and defaults splits; it knows nothing about costs (that is the rebalancer's job) or about torch.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence

from ppscope.errors import ErrorCode, InvalidSplitError

__all__ = [
    "ENV_VAR",
    "SOURCE_CLI",
    "SOURCE_DEFAULT",
    "SOURCE_ENV",
    "boundaries_as_counts",
    "format_split",
    "parse_counts",
    "parse_split",
    "resolve_split",
    "stage_layer_ranges",
    "validate_split",
    "vllm_default_split",
]

ENV_VAR = "PPSCOPE_PP_LAYER_PARTITION"
SOURCE_CLI = "--split"
SOURCE_ENV = ENV_VAR
SOURCE_DEFAULT = "vllm-default"


def parse_counts(text: str, example: str = "5,4,4,3") -> list[int]:
    """`5,4,4,3` into layer counts, checked only as text (`validate_split` checks them against a model);
    `example` is the split a refusal of an empty entry suggests."""
    parts = [p.strip() for p in text.strip().split(",")]
    if not text.strip() or any(not p for p in parts):
        raise InvalidSplitError(
            ErrorCode.SPLIT_NOT_INTEGERS,
            f"split {text!r} is empty or has an empty entry: give comma-separated layer counts per stage, e.g. "
            f"{example}",
        )
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise InvalidSplitError(
            ErrorCode.SPLIT_NOT_INTEGERS,
            f"split {text!r} is not a list of integers: give comma-separated layer counts per stage, e.g. 5,4,4,3",
        ) from None


def parse_split(text: str, layers: int, stages: int | None = None) -> list[int]:
    """Parse `5,4,4,3` into layer counts per stage and validate them against `layers` (and `stages`)."""
    example = format_split(vllm_default_split(layers, stages or 2)) if layers >= (stages or 2) else "4,4"
    counts = parse_counts(text, example)
    validate_split(counts, layers, stages)
    return counts


def validate_split(split: Sequence[int], layers: int, stages: int | None = None) -> None:
    """Raise InvalidSplitError unless `split` has `stages` entries, each >= 1, summing to `layers`."""
    text = format_split(split)
    if stages is not None and len(split) != stages:
        hint = format_split(vllm_default_split(layers, stages)) if 1 <= stages <= layers else ""
        raise InvalidSplitError(
            ErrorCode.SPLIT_STAGE_COUNT,
            f"split {text} has {len(split)} stage(s) but the pipeline has {stages}: give one layer count per stage"
            + (f", e.g. {hint}" if hint else ""),
        )
    small = [i for i, n in enumerate(split) if n < 1]
    if small:
        raise InvalidSplitError(
            ErrorCode.SPLIT_EMPTY_STAGE,
            f"split {text} gives stage(s) {', '.join(map(str, small))} fewer than 1 layer: every stage needs at "
            "least one layer (use fewer stages if the model is that small)",
        )
    total = sum(split)
    if total != layers:
        bounds = boundaries_as_counts(split, layers)
        if bounds is not None:
            raise InvalidSplitError(
                ErrorCode.SPLIT_LOOKS_LIKE_BOUNDS,
                f"split {text} looks like stage boundaries (where each stage ends), but a split is layer counts "
                f"per stage, as in VLLM_PP_LAYER_PARTITION: give {format_split(bounds)}",
            )
        diff = layers - total
        raise InvalidSplitError(
            ErrorCode.SPLIT_DOES_NOT_COVER_LAYERS,
            f"split {text} sums to {total} but the model has {layers} layers: "
            f"{'add' if diff > 0 else 'remove'} {abs(diff)} layer(s) so the counts sum to {layers}",
        )


def boundaries_as_counts(values: Sequence[int], layers: int) -> list[int] | None:
    """The layer counts meant by `values` when they read as the layer where each stage ends (strictly
    increasing, the last equal to `layers`, e.g. 20,40,60,80 for 80 layers), else None."""
    if len(values) < 2 or values[-1] != layers or values[0] < 1:
        return None
    if any(b <= a for a, b in itertools.pairwise(values)):
        return None
    return [b - a for a, b in zip([0, *values], values, strict=False)]


def vllm_default_split(layers: int, stages: int) -> list[int]:
    """vLLM's default partition: floor(L/P) per stage, the remainder added one each from the
    second-to-last stage backwards (the last stage keeps the floor because it also holds the LM head)."""
    if stages < 1:
        raise InvalidSplitError(ErrorCode.BAD_VALUE, f"the pipeline needs at least 1 stage, got {stages}")
    if layers < stages:
        raise InvalidSplitError(
            ErrorCode.TOO_FEW_LAYERS,
            f"{layers} layer(s) cannot be split over {stages} stages (each needs at least one): use at most "
            f"{layers} stage(s)",
        )
    split = [layers // stages] * stages
    for i in range(2, layers % stages + 2):
        split[-i] += 1
    return split


def stage_layer_ranges(split: Sequence[int]) -> list[tuple[int, int]]:
    """Half-open global layer ranges [start, end) of each stage, in order."""
    ranges = []
    start = 0
    for n in split:
        ranges.append((start, start + n))
        start += n
    return ranges


def format_split(split: Sequence[int]) -> str:
    return ",".join(str(n) for n in split)


def resolve_split(
    given: Sequence[int] | None, layers: int, stages: int, env: Mapping[str, str] | None = None
) -> tuple[list[int], str]:
    """The split to use and where it came from: `--split` (`given`), then PPSCOPE_PP_LAYER_PARTITION, then
    vLLM's default."""
    env = os.environ if env is None else env
    if given:
        validate_split(given, layers, stages)
        return list(given), SOURCE_CLI
    env_text = env.get(ENV_VAR, "").strip()
    if env_text:
        try:
            return parse_split(env_text, layers, stages), SOURCE_ENV
        except InvalidSplitError as exc:
            raise InvalidSplitError(exc.code, f"{ENV_VAR}: {exc}") from None
    return vllm_default_split(layers, stages), SOURCE_DEFAULT
