"""A training run's passes: the forward and backward of one micro-batch through one (virtual) stage.

torch.distributed.pipelining labels its compute with the action type as `phase`: `F` (forward), `B` (full
backward), `I` (backward for inputs) and `W` (backward for weights). The recording hook writes `forward` and
`backward` spans with those phases, the loss as a `head` span; the Kineto importer labels each operator or
kernel with the action it ran in. One pass of micro-batch m of step k through stage s is all of its compute
in those phases: F + B, or F + I + W. Its cost is what moves with the stage's layers when the split changes,
as the forward alone does in inference.

This module knows nothing about how passes are fitted into layer costs (`ppscope.balance.costs`).
"""

from __future__ import annotations

import pandas as pd

from ppscope.trace.model import COMPUTE_KINDS, SpanKind, Trace

__all__ = ["BACKWARD_PHASES", "TRAIN_PASSES", "is_training", "training_passes"]

BACKWARD_PHASES = ("B", "I", "W", "backward")
"""Phases of backward compute: the hook's and the importer's action types, and the schema's `backward`."""
TRAIN_PASSES = "forward+backward"
"""The name of a training run's passes where an inference run names `decode` or `prefill`."""
_FORWARD = "F"
_EXTRAS = {str(SpanKind.EMBED): "embed_ns", str(SpanKind.HEAD): "head_ns", str(SpanKind.SAMPLE): "sample_ns"}


def is_training(trace: Trace) -> bool:
    """Whether the trace runs backward passes: `backward` spans, or compute labelled with a backward phase."""
    spans = trace.spans
    compute = spans["kind"].isin([str(k) for k in COMPUTE_KINDS])
    return bool(
        (spans["kind"] == str(SpanKind.BACKWARD)).any() or (compute & spans["phase"].isin(BACKWARD_PHASES)).any()
    )


def training_passes(trace: Trace) -> pd.DataFrame:
    """One row per pass that ran both its forward and its backward: `stage`, `step`, `mb`, `start_ns` (its
    first compute), `forward_ns` and `backward_ns` (the summed compute of its decoder part, forward and
    backward phases), and `embed_ns`, `head_ns`, `sample_ns` (its spans of those kinds: the hook's loss is a
    `head` span). Compute without a stage or micro-batch (the optimizer, `zero_grad`) belongs to no pass."""
    spans = trace.spans
    rows = spans[spans["kind"].isin([str(k) for k in COMPUTE_KINDS]) & (spans["stage"] >= 0) & (spans["mb"] >= 0)]
    rows = rows[(rows["phase"] == _FORWARD) | rows["phase"].isin(BACKWARD_PHASES) | rows["kind"].isin(list(_EXTRAS))]
    ns = (rows["end_ns"] - rows["start_ns"]).astype("int64")
    extra = rows["kind"].map(_EXTRAS)
    column = extra.where(extra.notna(), rows["phase"].map(lambda p: "forward_ns" if p == _FORWARD else "backward_ns"))
    frame = pd.DataFrame(
        {"stage": rows["stage"], "step": rows["step"], "mb": rows["mb"], "column": column, "ns": ns,
         "start_ns": rows["start_ns"]}
    )  # fmt: skip
    keys = ["stage", "step", "mb"]
    columns = ["forward_ns", "backward_ns", *_EXTRAS.values()]
    if frame.empty:
        return pd.DataFrame(columns=[*keys, "start_ns", *columns])
    table = frame.pivot_table(index=keys, columns="column", values="ns", aggfunc="sum", fill_value=0)
    table = table.reindex(columns=columns, fill_value=0).astype("int64")
    table["start_ns"] = frame.groupby(keys)["start_ns"].min()
    table = table.reset_index()
    both = (table["forward_ns"] > 0) & (table["backward_ns"] > 0)
    return table[both].sort_values("start_ns", kind="stable").reset_index(drop=True)[[*keys, "start_ns", *columns]]
