"""Synthetic jobs of data-parallel pipelines: one simulated run per replica, merged into one trace."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ppscope.balance.costs import LayerCosts
from ppscope.simulate.simulator import SimConfig, simulate
from ppscope.trace.model import Trace, spans_frame


def replica_job(
    p: int = 4,
    replicas: int = 4,
    *,
    slow: dict[tuple[int, int], float] | None = None,
    stage_major: bool = True,
    say_replica: bool = True,
    microbatches: int = 8,
    layers: int = 0,
) -> Trace:
    """`replicas` gpipe pipelines of `p` stages; `slow[(stage, replica)]` divides that rank's speed. Global
    rank: stage * replicas + replica (stage-major, as Megatron and torchtitan lay out PP outermost) or
    replica * p + stage (replica-major). With `say_replica`, each rank's metadata names its replica. `layers`: the
    model's decoder layers, split evenly (default 2 a stage)."""
    slow = slow or {}
    parts, infos = [], []
    meta = None
    for rep in range(replicas):
        speed = tuple(1.0 / slow.get((s, rep), 1.0) for s in range(p))
        cfg = SimConfig(
            schedule="gpipe",
            stages=p,
            microbatches=microbatches,
            steps=2,
            costs=LayerCosts.uniform(layers or 2 * p, 1.0),
            speed=speed,
        )
        trace = simulate(cfg)
        meta = trace.meta

        def glob(stage: np.ndarray, rep: int = rep) -> np.ndarray:
            return stage * replicas + rep if stage_major else rep * p + stage

        spans = trace.spans.copy()
        spans["rank"] = glob(spans["rank"].to_numpy())
        peer = spans["peer"].to_numpy()
        spans["peer"] = np.where(peer >= 0, glob(peer), -1)
        parts.append(spans)
        for info in trace.meta.ranks:
            rank = int(glob(np.array(info.rank)))
            infos.append(dataclasses.replace(info, rank=rank, replica=rep if say_replica else -1))
    assert meta is not None
    meta = dataclasses.replace(meta, world_size=p * replicas, ranks=sorted(infos, key=lambda i: i.rank))
    return Trace(spans=spans_frame(pd.concat(parts, ignore_index=True)), meta=meta).sorted()
