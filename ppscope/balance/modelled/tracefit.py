"""Modelled layer costs calibrated on the measured stage times of another engine's trace.

An nsys or Kineto trace of vLLM, SGLang or any engine shows how busy each pipeline stage was, but not which
layers it held nor what each cost. The cost model (`ppscope.balance.modelled.roofline`) gives the shape: what every
layer, the embedding and the LM head cost relative to each other. `calibrate` fits that shape to the
trace's stage times for the split the trace ran with:

    measured_s = k x modelled_s(split) + o_s,   k = min over s of measured_s / modelled_s,   o_s >= 0

One scale `k` for every part, because the stages of one deployment run the same kernels on the same kind of
GPU: it absorbs what the model cannot know (the share of the datasheet peak the kernels reach, and, for busy
time summed over a window, the passes in it). What the scaled model leaves of each stage, `o_s`, stays with
the stage whatever layers it holds: sampling and scheduling, the first stage's input handling, kernels the
model does not count. One scale per stage would instead multiply that remainder into every layer the stage
holds and move more layers than it is worth. `k` is the smallest ratio, so no remainder is negative and the
stage the model explains best has none; the calibrated times of the current split equal the measured ones.
The advice then minimises the slowest calibrated stage. This module knows nothing about traces themselves:
the caller measures the stage times (`ppscope.analysis`) and names the split.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ppscope.balance.advise.problem import BalanceProblem
from ppscope.balance.advise.rebalance import evaluate
from ppscope.balance.costs import LayerCosts, StageCosts
from ppscope.balance.split import format_split
from ppscope.errors import ErrorCode, InvalidConfigError

__all__ = ["POOR_FIT", "Calibration", "calibrate"]

POOR_FIT = 0.25
"""A stage whose remainder is more than this share of its measured time is explained poorly by the model."""


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """The model's costs scaled to a trace's stage times, and the remainder each stage keeps."""

    split: tuple[int, ...]
    """The layer counts per stage the trace ran with."""
    measured_ms: tuple[float, ...]
    """Each stage's measured time, ms (busy time over the trace's window, or per pass)."""
    modelled_ms: tuple[float, ...]
    """Each stage's time under the uncalibrated model for `split`, ms per pass."""
    scale: float
    """Measured ms per modelled ms, one for every part of the model."""
    overhead_ms: tuple[float, ...]
    """Per stage, the measured time the scaled model leaves unexplained (>= 0), kept whatever the split, ms."""
    costs: LayerCosts
    """The model's costs times `scale`."""

    def stage_costs(self) -> StageCosts:
        """The remainders as the rebalancer's fixed per-stage overheads."""
        return StageCosts(overhead_ms=list(self.overhead_ms))

    def problem(self) -> BalanceProblem:
        """The rebalancing problem with the calibrated costs and overheads."""
        return BalanceProblem(costs=self.costs, stages=len(self.split), stage_costs=self.stage_costs())

    def calibrated_ms(self, split: Sequence[int]) -> list[float]:
        """Each stage's calibrated time with `split`, ms."""
        return list(evaluate(self.problem(), split).stage_ms)

    def poorly_explained(self) -> list[int]:
        """Stages whose remainder exceeds `POOR_FIT` of their measured time."""
        return [s for s, (o, m) in enumerate(zip(self.overhead_ms, self.measured_ms, strict=True)) if o > POOR_FIT * m]

    def to_dict(self) -> dict[str, Any]:
        return {
            "split": list(self.split),
            "measured_ms": list(self.measured_ms),
            "modelled_ms": list(self.modelled_ms),
            "scale": self.scale,
            "overhead_ms": list(self.overhead_ms),
            "calibrated_ms": self.calibrated_ms(self.split),
            "poorly_explained_stages": self.poorly_explained(),
            "how": "one scale for every part (the smallest measured ÷ modelled ratio over stages) plus a fixed "
            "overhead per stage (the rest of its measured time), kept whatever layers the stage holds",
        }


def calibrate(costs: LayerCosts, split: Sequence[int], measured_ms: Sequence[float]) -> Calibration:
    """Fit `costs` (the model's, for the trace's phase) to `measured_ms`, one time per stage of `split`
    (see the module docstring)."""
    if len(measured_ms) != len(split):
        raise InvalidConfigError(
            ErrorCode.COUNT_MISMATCH,
            f"the trace has {len(measured_ms)} stage(s) but the split {format_split(split)} has {len(split)}: give "
            f"--current-split with one layer count per stage of the trace",
        )
    measured = tuple(float(m) for m in measured_ms)
    idle = [s for s, m in enumerate(measured) if not (math.isfinite(m) and m > 0)]
    if idle:
        raise InvalidConfigError(
            ErrorCode.NO_COMPUTE,
            f"stage(s) {', '.join(map(str, idle))} of the trace have no compute time to calibrate on: trace a "
            "window in which every stage runs",
        )
    modelled = evaluate(BalanceProblem(costs=costs, stages=len(split)), split).stage_ms
    if min(modelled) <= 0:
        raise InvalidConfigError(ErrorCode.NO_COMPUTE, "the model gives a stage no cost: check --model and the split")
    scale = min(m / t for m, t in zip(measured, modelled, strict=True))
    scaled = LayerCosts(
        layer_ms=tuple(c * scale for c in costs.layer_ms),
        embed_ms=costs.embed_ms * scale,
        head_ms=costs.head_ms * scale,
        sample_ms=costs.sample_ms * scale,
    )
    # The scaled stage times through the rebalancer's own formula, so the current split is reproduced exactly.
    scaled_ms = evaluate(BalanceProblem(costs=scaled, stages=len(split)), split).stage_ms
    # The stage that sets the scale keeps no remainder but rounding's, which is dropped.
    overhead = tuple(m - t if m - t > 1e-9 * m else 0.0 for m, t in zip(measured, scaled_ms, strict=True))
    return Calibration(
        split=tuple(split),
        measured_ms=measured,
        modelled_ms=tuple(modelled),
        scale=scale,
        overhead_ms=overhead,
        costs=scaled,
    )
