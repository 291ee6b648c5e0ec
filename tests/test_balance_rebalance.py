"""The rebalancer: optimal against brute force on every small case, never worse than the usual rules."""

from __future__ import annotations

import itertools
import json
import math
import random

import pytest
from error_helpers import cli_error, raises_code
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppscope.balance.advise.problem import BalanceProblem, MemoryModel
from ppscope.balance.advise.rebalance import balance, engine_lines, evaluate, megatron_args, rebalance
from ppscope.balance.advise.search import CostModel
from ppscope.balance.costs import LayerCosts, StageCosts
from ppscope.balance.split import vllm_default_split
from ppscope.errors import DoesNotFitError, ErrorCode, InvalidConfigError


def all_splits(layers: int, stages: int) -> list[list[int]]:
    out = []
    for cuts in itertools.combinations(range(1, layers), stages - 1):
        ends = [*cuts, layers]
        out.append([e - s for s, e in zip([0, *cuts], ends, strict=True)])
    return out


def brute_force(problem: BalanceProblem) -> tuple[float, int | None] | None:
    """(best slowest stage, best KV capacity) by the problem's objective, or None when nothing fits."""
    evals = [evaluate(problem, s) for s in all_splits(problem.costs.layers, problem.stages)]
    mem = problem.memory
    if mem is not None:
        evals = [e for e in evals if e.kv_capacity is not None and e.kv_capacity >= mem.min_kv_tokens]
    if not evals:
        return None
    if problem.objective == "throughput" or mem is None:
        best = min(e.max_ms for e in evals)
        kv = [e.kv_capacity for e in evals if e.max_ms == best]
        return best, (None if mem is None else max(k for k in kv if k is not None))
    best_kv = max(e.kv_capacity for e in evals if e.kv_capacity is not None)
    return min(e.max_ms for e in evals if e.kv_capacity == best_kv), best_kv


costs_ms = st.one_of(
    st.integers(0, 4).map(float),  # small integers: many exact ties, which the tie-break must get right
    st.floats(0, 10, allow_nan=False, allow_infinity=False),
)


@st.composite
def problems(draw: st.DrawFn) -> BalanceProblem:
    layers = draw(st.integers(1, 12))
    stages = draw(st.integers(1, min(4, layers)))
    per_stage = st.lists(costs_ms, min_size=stages, max_size=stages)
    costs = LayerCosts(
        layer_ms=tuple(draw(st.lists(costs_ms, min_size=layers, max_size=layers))),
        embed_ms=draw(costs_ms),
        head_ms=draw(costs_ms),
        sample_ms=draw(costs_ms),
    )
    stage_costs = StageCosts(
        overhead_ms=draw(st.one_of(costs_ms, per_stage)),
        comm_ms=draw(st.one_of(costs_ms, per_stage)),
        speed=draw(
            st.one_of(
                st.just(1.0), st.lists(st.sampled_from([0.25, 0.5, 1.0, 1.5, 3.0]), min_size=stages, max_size=stages)
            )
        ),
    )
    memory = None
    if draw(st.booleans()):
        memory = MemoryModel(
            limit_bytes=tuple(draw(st.lists(st.integers(0, 120), min_size=stages, max_size=stages))),
            layer_bytes=draw(st.integers(0, 10)),
            kv_bytes_per_token_per_layer=draw(st.integers(0, 3)),
            embed_bytes=draw(st.integers(0, 20)),
            head_bytes=draw(st.integers(0, 20)),
            reserve_bytes=draw(st.integers(0, 5)),
            min_kv_tokens=draw(st.integers(0, 3)),
        )
    objective = draw(st.sampled_from(["throughput", "memory"])) if memory is not None else "throughput"
    return BalanceProblem(costs=costs, stages=stages, stage_costs=stage_costs, memory=memory, objective=objective)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_balance_equals_brute_force(problem: BalanceProblem) -> None:
    expected = brute_force(problem)
    if expected is None:
        with raises_code(DoesNotFitError, ErrorCode.NO_SPLIT_FITS):
            balance(problem)
        return
    split = balance(problem)
    got = evaluate(problem, split)
    assert sum(split) == problem.costs.layers and min(split) >= 1
    assert (got.max_ms, got.kv_capacity) == expected
    if problem.memory is not None:
        assert got.kv_capacity is not None and got.kv_capacity >= problem.memory.min_kv_tokens


@settings(max_examples=200, deadline=None)
@given(problems())
def test_never_worse_than_uniform_or_vllm_default(problem: BalanceProblem) -> None:
    problem = BalanceProblem(costs=problem.costs, stages=problem.stages, stage_costs=problem.stage_costs)
    best = evaluate(problem, balance(problem)).max_ms
    assert best <= evaluate(problem, vllm_default_split(problem.costs.layers, problem.stages)).max_ms
    uniform = [problem.costs.layers // problem.stages] * problem.stages
    uniform[-1] += problem.costs.layers - sum(uniform)
    assert best <= evaluate(problem, uniform).max_ms


def test_stage_time_formula_by_hand() -> None:
    costs = LayerCosts(layer_ms=(1.0, 2.0, 3.0, 4.0), embed_ms=0.5, head_ms=1.5, sample_ms=0.25)
    stage_costs = StageCosts(overhead_ms=[0.1, 0.2], comm_ms=0.3, speed=[1.0, 2.0])
    got = evaluate(BalanceProblem(costs=costs, stages=2, stage_costs=stage_costs), [3, 1])
    assert got.stage_ms == pytest.approx(((0.5 + 6 + 0.1) / 1 + 0.3, (4 + 1.75 + 0.2) / 2 + 0.3))
    assert got.bottleneck == 0


def test_last_stage_with_lm_head_gets_fewer_layers() -> None:
    costs = LayerCosts(layer_ms=(1.0,) * 15, head_ms=3.0)
    advice = rebalance(BalanceProblem(costs=costs, stages=4))
    assert advice.current.split == (4, 4, 4, 3)
    assert advice.current.stage_ms == (4.0, 4.0, 4.0, 6.0)
    assert advice.proposed.split[-1] == 2 and advice.proposed.max_ms == 5.0
    assert advice.predicted_speedup == pytest.approx(6.0 / 5.0)


@pytest.mark.parametrize("seed", range(12))
def test_measurement_noise_does_not_change_the_advice(seed: int) -> None:
    # 8 layers of 5 ms and a 15 ms head on 4 stages: the slowest stage is the last (1 layer + head, 20 ms)
    # whatever the rest does, and among the splits that fast 3,2,2,1 spreads the rest evenest (15, 10, 10).
    # Measured costs are never exactly equal; costs 1% apart must not tip the advice
    # to 4,2,1,1 (two stages at the limit) or 3,3,1,1.
    rng = random.Random(seed)
    costs = LayerCosts(
        layer_ms=tuple(5.0 * (1 + rng.uniform(-0.01, 0.01)) for _ in range(8)),
        head_ms=15.0 * (1 + rng.uniform(-0.01, 0.01)),
        embed_ms=0.02,
    )
    problem = BalanceProblem(costs=costs, stages=4)
    split = balance(problem)
    assert split == [3, 2, 2, 1]
    best = min(max(evaluate(problem, s).stage_ms) for s in all_splits(8, 4))
    assert max(evaluate(problem, split).stage_ms) == best


def test_heterogeneous_speeds_give_the_fast_gpu_more_layers() -> None:
    costs = LayerCosts(layer_ms=(1.0,) * 12)
    split = balance(BalanceProblem(costs=costs, stages=2, stage_costs=StageCosts(speed=[2.0, 1.0])))
    assert split == [8, 4]


def test_ties_go_to_more_kv_capacity() -> None:
    # Costs 4,0,0,4: [1,3] and [3,1] and [2,2] all take 4 ms; the stage with the head bytes must hold fewer layers.
    costs = LayerCosts(layer_ms=(4.0, 0.0, 0.0, 4.0))
    memory = MemoryModel(limit_bytes=(100, 100), layer_bytes=10, kv_bytes_per_token_per_layer=1, head_bytes=40)
    advice = rebalance(BalanceProblem(costs=costs, stages=2, memory=memory), [2, 2])
    assert advice.proposed.max_ms == 4.0
    assert advice.proposed.split == (3, 1)
    assert advice.proposed.kv_tokens == (23, 50)


def test_memory_objective_trades_time_for_capacity() -> None:
    costs = LayerCosts(layer_ms=(1.0,) * 8, head_ms=4.0)
    memory = MemoryModel(limit_bytes=(100, 100), layer_bytes=10, kv_bytes_per_token_per_layer=1)
    fast = balance(BalanceProblem(costs=costs, stages=2, memory=memory))
    roomy = balance(BalanceProblem(costs=costs, stages=2, memory=memory, objective="memory"))
    assert fast == [6, 2] and roomy == [4, 4]


def test_memory_limit_forces_layers_off_a_small_gpu() -> None:
    costs = LayerCosts(layer_ms=(1.0,) * 8)
    memory = MemoryModel(limit_bytes=(25, 200), layer_bytes=10, kv_bytes_per_token_per_layer=0)
    assert balance(BalanceProblem(costs=costs, stages=2, memory=memory)) == [2, 6]


def test_nothing_fits_says_so() -> None:
    memory = MemoryModel(limit_bytes=(10, 10), layer_bytes=20, kv_bytes_per_token_per_layer=1)
    with raises_code(DoesNotFitError, ErrorCode.NO_SPLIT_FITS):
        balance(BalanceProblem(costs=LayerCosts(layer_ms=(1.0,) * 4), stages=2, memory=memory))


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"layer_ms": (1.0, -1.0)}, ErrorCode.BAD_VALUE),
        ({"layer_ms": (1.0, math.nan)}, ErrorCode.BAD_VALUE),
        ({"layer_ms": ()}, ErrorCode.MISSING_OPTION),
        ({"layer_ms": (1.0,), "head_ms": -2.0}, ErrorCode.BAD_VALUE),
    ],
)
def test_bad_costs_are_named(kwargs: dict, code: ErrorCode) -> None:
    with raises_code(InvalidConfigError, code):
        LayerCosts(**kwargs)


def test_fewer_layers_than_stages_and_wrong_lengths() -> None:
    costs = LayerCosts(layer_ms=(1.0, 1.0))
    with raises_code(InvalidConfigError, ErrorCode.TOO_FEW_LAYERS):
        BalanceProblem(costs=costs, stages=3)
    with raises_code(InvalidConfigError, ErrorCode.COUNT_MISMATCH):
        BalanceProblem(costs=costs, stages=2, stage_costs=StageCosts(speed=[1, 1, 1]))
    with raises_code(InvalidConfigError, ErrorCode.BAD_VALUE):
        BalanceProblem(costs=costs, stages=2, stage_costs=StageCosts(speed=[1, 0]))
    with raises_code(InvalidConfigError, ErrorCode.MISSING_OPTION):
        BalanceProblem(costs=costs, stages=2, objective="memory")
    with raises_code(InvalidConfigError, ErrorCode.UNKNOWN_CHOICE):
        BalanceProblem(costs=costs, stages=2, objective="latency")


def test_engine_lines() -> None:
    lines = engine_lines([5, 4, 4, 3], 16)
    assert lines["vllm_env"] == "VLLM_PP_LAYER_PARTITION=5,4,4,3"
    assert lines["sglang_env"] == "SGLANG_PP_LAYER_PARTITION=5,4,4,3"
    assert lines["ppscope_run"] == "ppscope run --split 5,4,4,3"
    assert megatron_args([5, 4, 4, 3]) == "--decoder-first-pipeline-num-layers 5 --decoder-last-pipeline-num-layers 3"
    assert megatron_args([5, 4, 3, 3]) is None
    assert "not expressible" in engine_lines([5, 4, 3, 3], 15)["megatron_args"]


def test_large_problem_is_exact_against_a_slow_dp() -> None:
    # An O(P L^2) dynamic programme over the same stage-time formula, on a size brute force cannot reach.
    rng = random.Random(7)
    layers, stages = 60, 7
    costs = LayerCosts(layer_ms=tuple(rng.uniform(0.5, 2.0) for _ in range(layers)), embed_ms=1.0, head_ms=6.0)
    problem = BalanceProblem(costs=costs, stages=stages, stage_costs=StageCosts(speed=[1, 1, 2, 1, 1, 0.5, 1]))
    model = CostModel(problem)
    best = [[math.inf] * (layers + 1) for _ in range(stages + 1)]
    best[0][0] = -math.inf
    for s in range(stages):
        for j in range(1, layers + 1):
            best[s + 1][j] = min(max(best[s][i], model.time(s, i, j)) for i in range(j))
    assert evaluate(problem, balance(problem)).max_ms == best[stages][layers]


def test_cli_rebalance_from_layer_costs(capsys: pytest.CaptureFixture[str]) -> None:
    from ppscope.cli.main import main

    args = ["rebalance", "--layer-costs", ",".join(["1"] * 15), "--head-cost", "3", "--stages", "4"]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["current_split"] == [4, 4, 4, 3] and sum(data["proposed_split"]) == 15
    assert data["stage_times_ms"]["current"] == [4.0, 4.0, 4.0, 6.0]
    assert max(data["stage_times_ms"]["proposed"]) == 5.0
    assert data["predicted_speedup"] == pytest.approx(1.2)
    assert data["vllm_env"] == "VLLM_PP_LAYER_PARTITION=" + ",".join(map(str, data["proposed_split"]))
    assert data["sglang_env"].startswith("SGLANG_PP_LAYER_PARTITION=")
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "predicted speedup ×1.200" in text and "VLLM_PP_LAYER_PARTITION=" in text and "ppscope run --split" in text


def test_cli_rebalance_with_memory_shows_kv_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    from ppscope.cli.main import main

    args = ["rebalance", "--layers", "80", "--layer-cost-ms", "1", "--head-cost", "3", "--stages", "4"]
    assert main([*args, "--model", "llama3-70b", "--gpu-mem-gib", "40", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kv_capacity_tokens"]["proposed"] >= data["kv_capacity_tokens"]["current"] > 0
    assert len(data["kv_tokens"]["proposed"]) == 4


@pytest.mark.parametrize(
    ("extra", "code", "names"),
    [  # what the message names: the bad entry, the counts, the option to give
        (["--layer-costs", "1,nan", "--stages", "2"], ErrorCode.BAD_VALUE, ("--layer-costs", "nan")),
        (["--layer-costs", "1,x", "--stages", "2"], ErrorCode.BAD_VALUE, ("--layer-costs", "1,x")),
        (["--layer-costs", "1,1", "--stages", "3"], ErrorCode.TOO_FEW_LAYERS, ("3 stages",)),
        (
            ["--layer-costs", "1,1,1", "--stages", "2", "--current-split", "1,1"],
            ErrorCode.SPLIT_DOES_NOT_COVER_LAYERS,
            ("1,1", "3 layers"),
        ),
        (["--layer-costs", "1,1", "--stages", "2", "--speeds", "1,1,1"], ErrorCode.COUNT_MISMATCH, ("--speeds",)),
        (["--layer-costs", "1,1"], ErrorCode.MISSING_OPTION, ("--stages",)),
        ([], ErrorCode.MISSING_OPTION, ("RUN", "--layer-costs")),
    ],
)
def test_cli_rebalance_bad_input_is_one_line(
    extra: list[str], code: ErrorCode, names: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    failed = cli_error(capsys, ["rebalance", *extra])
    assert failed.exit_code == 2 and failed.code == code, failed
    assert failed.err.count("\n") == 1 and all(name in failed.text for name in names), failed


def test_the_split_in_the_trainers_own_terms() -> None:
    from ppscope.balance.advise.rebalance import megatron_layout, torchtitan_parts

    assert megatron_layout([5, 3]) == "Et*5|t*3,L"
    assert megatron_layout([2, 3, 3, 2]) == "Et*2|t*3|t*3|t*2,L"
    assert megatron_layout([8]) == "Et*8,L"
    parts = torchtitan_parts([2, 1])
    assert parts == [["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "norm", "output"]]
    lines = engine_lines([2, 1], 3)
    assert lines["megatron_layout"] == "--pipeline-model-parallel-layout 'Et*2|t*1,L'"
    assert lines["torchtitan_toml"] == (
        'module_fqns_per_model_part = [["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "norm", "output"]]'
    )


def test_torchtitan_first_and_last_stage_with_fewer_layers() -> None:
    from ppscope.balance.advise.rebalance import torchtitan_even_split, torchtitan_less_layers

    # torchtitan's own example: 8 layers on 2 stages with its defaults (1, 1) is 4,4
    assert torchtitan_even_split(2, 8, 1, 1) == [4, 4]
    # 30 layers, 4 stages, the embedding counted as one layer: 31 = 8+8+8+7, less one on the first
    assert torchtitan_less_layers([7, 8, 8, 7]) == (1, 0) and torchtitan_even_split(4, 30, 1, 0) == [7, 8, 8, 7]
    for split in ([8, 9, 8, 7], [3, 5, 3], [6, 2], [1, 1]):
        pair = torchtitan_less_layers(split)
        assert pair is not None and torchtitan_even_split(len(split), sum(split), *pair) == split
    assert torchtitan_less_layers([5, 3, 5]) is None  # a middle stage below the ends: not its even rule
    assert torchtitan_even_split(3, 3, 3, 0) is None  # a weight above a stage's share: torchtitan refuses it
    assert torchtitan_even_split(2, 4, 4, 0) is None  # the first stage left without a layer
    lines = engine_lines([7, 8, 8, 7], 30)
    assert lines["torchtitan_args"] == (
        "--parallelism.pipeline_parallel_first_stage_less_layers 1 "
        "--parallelism.pipeline_parallel_last_stage_less_layers 0"
    )
    assert "not expressible" in engine_lines([5, 3, 5], 13)["torchtitan_args"]
    assert "virtual stages" in engine_lines([2, 2, 2, 2], 8, chunks=2)["torchtitan_args"]
