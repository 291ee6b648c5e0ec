"""Synthetic training jobs of data-parallel pipelines with known per-(stage, replica) costs: each replica's step
is its 1F1B order replayed with those costs, written as the recording hook's forward/backward spans."""

from __future__ import annotations

from ppscope.simulate.training import replay_order
from ppscope.trace.actions import Action, ActionType
from ppscope.trace.model import RankInfo, RunMeta, Trace


def one_f_one_b(p: int, m: int, ranks: list[int] | None = None) -> dict[int, list[Action]]:
    """PipeDream-Flush: stage s (on `ranks[s]`, default rank s) runs P-1-s forwards, then one forward and one
    backward in turn, then the rest."""
    ranks = ranks or list(range(p))
    out = {}
    for s in range(p):
        warm = min(p - 1 - s, m)
        acts = [Action(s, ActionType.FORWARD, i) for i in range(warm)]
        for i in range(m - warm):
            acts += [Action(s, ActionType.FORWARD, warm + i), Action(s, ActionType.FULL_BACKWARD, i)]
        acts += [Action(s, ActionType.FULL_BACKWARD, i) for i in range(m - warm, m)]
        out[ranks[s]] = acts
    return out


def training_job(
    p: int = 4,
    replicas: int = 2,
    *,
    m: int = 8,
    steps: int = 3,
    f_ns: int = 1000,
    b_ns: int = 2000,
    slow: dict[tuple[int, int], float] | None = None,
    tp: int = 1,
) -> Trace:
    """`replicas` 1F1B pipelines of `p` stages, M = `m`, each stage's forward `f_ns` and backward `b_ns` times
    `slow[(stage, replica)]` (default 1). Ranks stage-major, `tp` per (stage, replica): rank
    (stage * replicas + replica) * tp + i, every one of a unit's ranks running its actions. Steps one after
    another, each 500 ns (the optimizer) after the slowest replica's; the metadata names each rank's stage and
    replica."""
    slow = slow or {}
    rows, infos = [], []
    steps_of = {}
    for rep in range(replicas):
        cost = {}
        for s in range(p):
            x = slow.get((s, rep), 1.0)
            cost[(s, "F")], cost[(s, "B")] = round(f_ns * x), round(b_ns * x)
        steps_of[rep] = replay_order(one_f_one_b(p, m, _leads(p, replicas, rep, tp)), cost)
    period = max(one.window_ns for one in steps_of.values()) + 500  # every replica waits for the slowest
    for rep, one in steps_of.items():
        lead = _leads(p, replicas, rep, tp)
        for k in range(steps):
            shift = k * period
            for t in one.actions:
                for i in range(tp):
                    rows.append(
                        {
                            "rank": t.rank + i,
                            "stage": t.action.stage,
                            "mb": t.action.mb,
                            "step": k,
                            "kind": "forward" if t.action.type == "F" else "backward",
                            "lane": "compute",
                            "phase": str(t.action.type),
                            "start_ns": t.start_ns + shift,
                            "end_ns": t.end_ns + shift,
                            "name": str(t.action),
                        }
                    )
        infos += [RankInfo(rank=r + i, stage=s, replica=rep) for s, r in enumerate(lead) for i in range(tp)]
    meta = RunMeta(
        source="pipelining",
        status="finished",
        world_size=p * replicas * tp,
        pp_size=p,
        schedule="1f1b",
        microbatches=m,
        ranks=sorted(infos, key=lambda i: i.rank),
    )
    return Trace.from_records(rows, meta=meta)


def _leads(p: int, replicas: int, rep: int, tp: int) -> list[int]:
    """Each stage's first rank in replica `rep`."""
    return [(s * replicas + rep) * tp for s in range(p)]
