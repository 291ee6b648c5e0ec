"""A training run's passes: the forward and backward of one micro-batch through one (virtual) stage.

torch.distributed.pipelining labels its compute with the action type as `phase`: `F` (forward), `B` (full
backward), `I` (backward for inputs) and `W` (backward for weights). The recording hook writes `forward` and
`backward` spans with those phases, the loss as a `head` span; the Kineto importer labels each operator or
kernel with the action it ran in. One pass of micro-batch m of step k through stage s is all of its compute
in those phases: F + B, or F + I + W. Its cost is what moves with the stage's layers when the split changes,
as the forward alone does in inference.

This module knows nothing about how passes are fitted into layer costs (`ppscope.balance.measured.fit`).
"""

from __future__ import annotations

import pandas as pd

from ppscope.balance.measured.timings import BACKWARD_PHASES, PASS_KEYS, PASS_SUMS, RunTimings, partial_passes
from ppscope.trace.model import COMPUTE_KINDS, SpanKind, Trace

__all__ = ["BACKWARD_PHASES", "TRAIN_PASSES", "is_training", "training_passes"]

TRAIN_PASSES = "forward+backward"
"""The name of a training run's passes where an inference run names `decode` or `prefill`."""


def is_training(run: Trace | RunTimings) -> bool:
    """Whether the run has backward passes: `backward` spans, or compute labelled with a backward phase."""
    if isinstance(run, RunTimings):
        return run.training
    spans = run.spans
    compute = spans["kind"].isin([str(k) for k in COMPUTE_KINDS])
    return bool(
        (spans["kind"] == str(SpanKind.BACKWARD)).any() or (compute & spans["phase"].isin(BACKWARD_PHASES)).any()
    )


def training_passes(run: Trace | RunTimings) -> pd.DataFrame:
    """One row per pass that ran both its forward and its backward: `stage`, `step`, `mb`, `start_ns` (its
    first compute), `forward_ns` and `backward_ns` (the summed compute of its decoder part, forward and
    backward phases), and `embed_ns`, `head_ns`, `sample_ns` (its spans of those kinds: the hook's loss is a
    `head` span); each the mean over the ranks that ran the stage. Compute without a stage or micro-batch (the
    optimizer, `zero_grad`) belongs to no pass."""
    table = run.passes if isinstance(run, RunTimings) else partial_passes(run.spans)
    if table.empty:
        return pd.DataFrame(columns=[*PASS_KEYS, "start_ns", *PASS_SUMS])
    both = (table["forward_ns"] > 0) & (table["backward_ns"] > 0)
    # the ranks of one stage (replicas, tensor-parallel ranks) each ran the pass: its time is their mean
    agg = {**dict.fromkeys(PASS_SUMS, "mean"), "start_ns": "min"}
    table = table[both].groupby(PASS_KEYS, sort=True).agg(agg).reset_index()
    table = table.astype({c: "int64" for c in [*PASS_SUMS, "start_ns"]})
    table = table.sort_values("start_ns", kind="stable").reset_index(drop=True)
    return table[[*PASS_KEYS, "start_ns", *PASS_SUMS]]
