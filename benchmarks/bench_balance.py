"""Rebalancer speed on L = 1000 layers and P = 64 stages (target: <= 10 ms), as a ratio to evaluating one
split with the same cost model, measured in this process (best of several rounds).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from benchmarks.record import Figure

ROUNDS = 7


def _best_ms(fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        t0 = time.perf_counter_ns()
        fn()
        best = min(best, (time.perf_counter_ns() - t0) / 1e6)
    return best


def _problems(layers: int, stages: int) -> dict[str, Any]:
    """The balance problems timed, by name: L layers of random cost over P stages, plain and with each
    complication the solver has to take."""
    from ppscope.balance.advise.problem import BalanceProblem, MemoryModel
    from ppscope.balance.costs import LayerCosts, StageCosts

    rng = random.Random(0)
    costs = LayerCosts(layer_ms=tuple(rng.uniform(0.5, 1.5) for _ in range(layers)), embed_ms=3.0, head_ms=8.0)
    base = StageCosts(overhead_ms=0.2, comm_ms=0.1)
    speeds = [rng.choice([0.7, 1.0, 1.3]) for _ in range(stages)]
    memory = MemoryModel(
        limit_bytes=(80 << 30,) * stages,
        layer_bytes=(1 << 30) // 2,
        kv_bytes_per_token_per_layer=4096,
        embed_bytes=2 << 30,
        head_bytes=2 << 30,
    )
    spiky_ms = list(costs.layer_ms)
    spiky_ms[500] = 50.0  # one layer worth 50 others, and a first GPU ten times slower
    return {
        "uniform GPUs": BalanceProblem(costs=costs, stages=stages, stage_costs=base),
        "mixed GPU speeds": BalanceProblem(
            costs=costs, stages=stages, stage_costs=StageCosts(overhead_ms=0.2, comm_ms=0.1, speed=speeds)
        ),
        "with memory limits": BalanceProblem(costs=costs, stages=stages, memory=memory),
        "one huge layer, one slow GPU": BalanceProblem(
            costs=LayerCosts(layer_ms=tuple(spiky_ms), embed_ms=10.0),
            stages=stages,
            stage_costs=StageCosts(speed=[0.1] + [1.0] * (stages - 1)),
        ),
    }


def main() -> list[Figure]:
    from ppscope.balance.advise.rebalance import balance, evaluate
    from ppscope.balance.split import vllm_default_split

    layers, stages = 1000, 64
    problems = _problems(layers, stages)
    default = vllm_default_split(layers, stages)
    plain = problems["uniform GPUs"]
    ref = _best_ms(lambda: [evaluate(plain, default) for _ in range(10)]) / 10
    one_evaluation = f"evaluating one split of L={layers} over P={stages}"
    figures = []
    for name, problem in problems.items():
        ms = _best_ms(lambda p=problem: balance(p))  # type: ignore[misc]
        gain = evaluate(problem, default).max_ms / evaluate(problem, balance(problem)).max_ms
        figures += [
            Figure(
                f"balance L={layers} P={stages}, {name}",
                ms,
                "ms",
                one_evaluation,
                ref,
                target="<= 10 ms",
                met=ms <= 10.0,
            ),
            Figure(
                f"predicted gain of the balanced split over vLLM's default, {name}",
                gain,
                "x",
                "vLLM's default split's slowest stage ÷ the balanced split's",
                ratio=gain,
            ),
        ]
    return figures


if __name__ == "__main__":
    for figure in main():
        print(figure)
