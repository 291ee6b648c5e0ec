"""The rebalancer: the contiguous layer split that minimises the slowest stage, exactly.

Stage s holding layers [i, j) takes
    t_s = (embed if s is first + Σ layer costs + head and sample if s is last + overhead_s) / speed_s + hop_s
and, with a memory model, holds weights plus KV cache within its limit; the pipeline's KV capacity is the
minimum over stages. `balance` returns the split with the smallest max_s t_s, ties going to the largest KV
capacity (objective `throughput`), or the largest KV capacity, ties going to the fastest (`memory`). Among
the splits that remain, it takes one that spreads the rest of the work evenly (from the last stage back, each
stage starts nearest where an even share of the layer cost before it would put it), so that costs measured a
hair apart do not tip the advice to a split with two stages at the limit.
It knows nothing about where costs come from (`ppscope.balance.measured`, `ppscope.balance.modelled`) or how
engines run a split.

Note on exactness: every stage time is computed by one formula from prefix sums
(`ppscope.balance.advise.search.CostModel`).
Floating-point rounding is monotone, so "stage s can take layers [i, j) within T" is monotone in i, j and T,
and a search over T that always snaps to the slowest stage of a split it found ends on an achieved value
with the next smaller double infeasible: the optimum itself, not an approximation of it. The probe "is there
a split within T keeping C tokens of KV cache per stage" is a greedy O(P log L) reach while every stage can
hold each single layer it might start at (checked with a range-maximum table), else an exact O(P·L) pass
over every reachable stage end. KV capacity is an integer, searched the same way (docs/ARCHITECTURE.md, "Why the
split is exact").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ppscope.balance.advise.problem import BalanceProblem
from ppscope.balance.advise.search import CostModel, evenest, max_kv, min_time
from ppscope.balance.split import format_split, stage_layer_ranges, validate_split, vllm_default_split
from ppscope.errors import DoesNotFitError, ErrorCode
from ppscope.trace.actions import StrEnum

__all__ = [
    "DEEPSPEED_NOTE",
    "JobKind",
    "Rebalance",
    "SplitEval",
    "balance",
    "engine_lines",
    "evaluate",
    "megatron_args",
    "megatron_layout",
    "rebalance",
    "torchtitan_parts",
]


@dataclass(frozen=True, kw_only=True)
class SplitEval:
    """A split and what the cost model predicts for it."""

    split: tuple[int, ...]
    stage_ms: tuple[float, ...]
    """Predicted time of each stage per micro-batch."""
    kv_tokens: tuple[int, ...] | None
    """KV cache tokens each stage holds (None without a memory model; -1: weights do not fit)."""

    @property
    def max_ms(self) -> float:
        return max(self.stage_ms)

    @property
    def bottleneck(self) -> int:
        return self.stage_ms.index(self.max_ms)

    @property
    def kv_capacity(self) -> int | None:
        """Tokens the whole pipeline holds: the minimum over stages."""
        return None if self.kv_tokens is None else min(self.kv_tokens)

    @property
    def fits(self) -> bool:
        return self.kv_tokens is None or min(self.kv_tokens) >= 0


def _no_fit_error(model: CostModel) -> DoesNotFitError:
    mem = model.memory
    assert mem is not None
    need = [
        f"stage {s}: {mem.free_bytes(s, model.stages) / 2**30:.2f} GiB free for layers of "
        f"{mem.layer_bytes / 2**30:.2f} GiB"
        for s in range(model.stages)
    ]
    return DoesNotFitError(
        ErrorCode.NO_SPLIT_FITS,
        f"no split of {model.layers} layers over {model.stages} stages fits the memory limits "
        f"(with {mem.min_kv_tokens} KV tokens per stage; {'; '.join(need)}): use more stages, more memory per "
        "GPU, or a smaller dtype",
    )


def balance(problem: BalanceProblem) -> list[int]:
    """The optimal split (layer counts per stage) for `problem`; see the module docstring."""
    model = CostModel(problem)
    model.prepare_search()
    if model.memory is None:
        split = min_time(model, 0)
        assert split is not None  # without memory limits every split is feasible
        return evenest(model, split, 0)
    if problem.objective == "throughput":
        split = min_time(model, model.memory.min_kv_tokens)
        if split is None:
            raise _no_fit_error(model)
        kv = max_kv(model, max(model.split_times(split)))
    else:
        kv = max_kv(model, math.inf)
        if kv < 0:
            raise _no_fit_error(model)
        split = min_time(model, kv)
        assert split is not None
    return evenest(model, split, kv)


def evaluate(problem: BalanceProblem, split: Sequence[int]) -> SplitEval:
    """Predicted stage times and KV capacity of `split` under `problem`'s cost model."""
    validate_split(split, problem.costs.layers, problem.stages)
    model = CostModel(problem)
    kv = model.kv_tokens(split)
    return SplitEval(
        split=tuple(split), stage_ms=tuple(model.split_times(split)), kv_tokens=None if kv is None else tuple(kv)
    )


class JobKind(StrEnum):
    """What the split is for, which decides the engines whose paste lines fit it."""

    SERVING = "serving"  # inference: vLLM, SGLang (and ppscope's engine)
    TRAINING = "training"  # a training schedule, backward passes: Megatron-LM, torchtitan
    DEEPSPEED = "deepspeed"  # DeepSpeed's pipeline engine, which takes no layer counts per stage
    UNKNOWN = "unknown"  # nothing says: the lines of both, and the report says so


SERVING_LINES = ("vllm_env", "sglang_env", "ppscope_run")
TRAINING_LINES = ("megatron_args", "megatron_layout", "torchtitan_toml", "torchtitan_args")
_LINES_OF = {
    JobKind.SERVING: SERVING_LINES,
    JobKind.TRAINING: TRAINING_LINES,
    JobKind.DEEPSPEED: (),
    JobKind.UNKNOWN: SERVING_LINES + TRAINING_LINES,
}
DEEPSPEED_NOTE = (
    "DeepSpeed's PipelineModule takes no layer counts per stage (partition_method is 'uniform', 'parameters' or "
    "'type:REGEX'): 'parameters' comes closest, since it counts the embedding's and the LM head's weights and so "
    "gives the first and last stages fewer layers; or subclass the model so that the stages' layers are the "
    "advised counts"
)


@dataclass(frozen=True, kw_only=True)
class Rebalance:
    """Advice: the current split, the proposed one, and what the cost model predicts for both."""

    current: SplitEval
    proposed: SplitEval
    objective: str
    chunks: int = 1
    """Virtual stages per rank (V): with more than one, the splits are per virtual stage, in stage order."""
    job: JobKind = JobKind.UNKNOWN
    """What the split is for: the paste lines are those of its engines (`lines`)."""

    @property
    def predicted_speedup(self) -> float:
        """Throughput gain: slowest stage before ÷ after (1.0: no gain)."""
        return self.current.max_ms / self.proposed.max_ms if self.proposed.max_ms > 0 else 1.0

    @property
    def lines(self) -> dict[str, str]:
        """The proposed split as each engine of the job's kind takes it (`engine_lines`), by its JSON key."""
        every = engine_lines(self.proposed.split, sum(self.current.split), chunks=self.chunks)
        return {k: v for k, v in every.items() if k in _LINES_OF[self.job]}

    def to_dict(self) -> dict[str, Any]:
        """The split search's answer as JSON-ready data (keys in docs/GLOSSARY.md, `rebalance`): its speedup is
        the slowest stage's ratio, which a report may lead with another prediction (`predicted_speedup`)."""
        both = {"current": self.current, "proposed": self.proposed}
        return {
            "objective": self.objective,
            "current_split": list(self.current.split),
            "proposed_split": list(self.proposed.split),
            "stage_times_ms": {k: list(v.stage_ms) for k, v in both.items()},
            "bottleneck_stage": {k: v.bottleneck for k, v in both.items()},
            "max_stage_ms": {k: v.max_ms for k, v in both.items()},
            "slowest_stage_speedup": self.predicted_speedup,
            "kv_tokens": {k: None if v.kv_tokens is None else list(v.kv_tokens) for k, v in both.items()},
            "kv_capacity_tokens": {k: v.kv_capacity for k, v in both.items()},
            "job": str(self.job),
            **dict.fromkeys(SERVING_LINES + TRAINING_LINES),
            **self.lines,
            "deepspeed": DEEPSPEED_NOTE if self.job == JobKind.DEEPSPEED else None,
        }


def rebalance(problem: BalanceProblem, current: Sequence[int] | None = None, *, chunks: int = 1) -> Rebalance:
    """Advise a split; `current` defaults to vLLM's default rule. With `chunks` > 1 the problem's stages are
    virtual stages (stage s on rank s mod P), balanced each as a stage of its own."""
    cur = list(current) if current is not None else vllm_default_split(problem.costs.layers, problem.stages)
    return Rebalance(
        current=evaluate(problem, cur),
        proposed=evaluate(problem, balance(problem)),
        objective=problem.objective,
        chunks=chunks,
    )


def megatron_args(split: Sequence[int], chunks: int = 1) -> str | None:
    """Megatron-LM flags for `split`, or None when its form (equal middle stages) cannot express it. With
    `chunks` virtual stages per rank (virtual stage s on rank s mod P) the flags count a rank's layers, which
    Megatron spreads evenly over its virtual stages: None unless each rank's virtual stages are equal."""
    if chunks > 1:
        ranks = len(split) // chunks
        if ranks * chunks != len(split) or any(len(set(split[r::ranks])) > 1 for r in range(ranks)):
            return None
        split = [sum(split[r::ranks]) for r in range(ranks)]
    if len(split) == 1:
        return ""
    middle = split[1:-1]
    if len(set(middle)) > 1:
        return None
    return f"--decoder-first-pipeline-num-layers {split[0]} --decoder-last-pipeline-num-layers {split[-1]}"


def megatron_layout(split: Sequence[int]) -> str:
    """Megatron-LM's `--pipeline-model-parallel-layout`: one `|`-separated part per (virtual) stage, `E` the
    embedding on the first, `t*N` its decoder layers, `L` the output layer and loss on the last."""
    parts = [f"t*{n}" for n in split]
    parts[0] = f"E{parts[0]}"
    parts[-1] = f"{parts[-1]},L"
    return "|".join(parts)


def torchtitan_parts(split: Sequence[int]) -> list[list[str]]:
    """torchtitan's `module_fqns_per_model_part` for its Llama-style models: each (virtual) stage's modules,
    the embedding with the first, the final norm and output with the last."""
    parts = [[f"layers.{i}" for i in range(first, end)] for first, end in stage_layer_ranges(split)]
    parts[0] = ["tok_embeddings", *parts[0]]
    parts[-1] = [*parts[-1], "norm", "output"]
    return parts


def _torchtitan_args(split: Sequence[int], chunks: int) -> str:
    pair = torchtitan_less_layers(split) if chunks == 1 and len(split) > 1 else None
    if pair is None:
        why = "one stage" if len(split) == 1 else "virtual stages" if chunks > 1 else "not its even rule"
        return f"(not expressible as first/last stage with fewer layers: {why}; use module_fqns_per_model_part)"
    return (
        f"--parallelism.pipeline_parallel_first_stage_less_layers {pair[0]} "
        f"--parallelism.pipeline_parallel_last_stage_less_layers {pair[1]}"
    )


def torchtitan_even_split(stages: int, layers: int, first_less: int, last_less: int) -> list[int] | None:
    """The split torchtitan makes itself when given no module names: the layers plus `first_less` and
    `last_less` (what the embedding and the output count as) spread evenly, the first stages one more where
    it does not divide; the first stage then holds `first_less` fewer layers, the last `last_less` fewer.
    None where torchtitan refuses the setting (a stage left without layers, a weight above a stage's share)."""
    total = layers + first_less + last_less
    if stages < 2 or stages > total:
        return None
    base, extra = divmod(total, stages)
    if first_less > base or last_less > base:
        return None
    split = [base + (i < extra) for i in range(stages)]
    split[0] -= first_less
    split[-1] -= last_less
    return split if min(split) >= 1 else None


def torchtitan_less_layers(split: Sequence[int]) -> tuple[int, int] | None:
    """torchtitan's `pipeline_parallel_first_stage_less_layers` and `..._last_stage_less_layers` that give
    `split` by its even rule (`torchtitan_even_split`), the smallest pair; None when no pair gives it."""
    layers, stages = sum(split), len(split)
    pairs = sorted(((a, b) for a in range(max(split) + 1) for b in range(max(split) + 1)), key=lambda p: (sum(p), p))
    return next((p for p in pairs if torchtitan_even_split(stages, layers, *p) == list(split)), None)


def engine_lines(split: Sequence[int], layers: int, *, chunks: int = 1) -> dict[str, str]:
    """The split written the way each engine takes it, checked first against the model's `layers`: a line
    to paste never names a split of another model. With `chunks` > 1 the split is per virtual stage: the
    layout and torchtitan's model parts list one part per virtual stage, in stage order."""
    validate_split(split, layers)
    text = format_split(split)
    megatron = megatron_args(split, chunks)
    fqns = ", ".join("[" + ", ".join(f'"{m}"' for m in part) + "]" for part in torchtitan_parts(split))
    return {
        "vllm_env": f"VLLM_PP_LAYER_PARTITION={text}",
        "sglang_env": f"SGLANG_PP_LAYER_PARTITION={text}",
        "megatron_args": megatron
        if megatron is not None
        else "(not expressible: Megatron's first/last form needs equal middle stages"
        + (", and equal virtual stages on each rank)" if chunks > 1 else ")"),
        "megatron_layout": f"--pipeline-model-parallel-layout '{megatron_layout(split)}'",
        "torchtitan_toml": f"module_fqns_per_model_part = [{fqns}]",
        "torchtitan_args": _torchtitan_args(split, chunks),
        "ppscope_run": f"ppscope run --split {text}",
    }
