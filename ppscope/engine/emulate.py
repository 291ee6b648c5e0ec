"""Emulated GPU stages: the synthetic model's waits set to the cost model's times of a real model on a real GPU.

The engine runs as ever (ranks, ring, schedules, recorder, requests); only each decoder layer, the embedding and
the LM head take the time `ppscope.balance.modelled` gives that part on the GPU, times one scale factor, as a wait
that holds no core. So four stages run on two shared cores as they would on four GPUs, and the pipeline's
imbalance is the real model's, not the noise of ranks fighting for cores. This module only turns a model and a
GPU into the synthetic model's costs; it knows nothing of processes or tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ppscope.balance.modelled.gpus import gpu_named
from ppscope.balance.modelled.roofline import Workload, model_costs
from ppscope.balance.modelled.shapes import PRESETS, RENAMED, ModelShape
from ppscope.errors import ErrorCode, InvalidConfigError

__all__ = ["MEAN_STAGE_MS", "WAIT_RESOLUTION_MS", "Emulation", "emulation", "emulation_text"]

MEAN_STAGE_MS = 30.0
"""The scale makes a stage's mean step about this long (ms): gloo's ~0.5 ms hop and the scheduler's wake-ups
stay a few percent of it, and a run of a few hundred steps lasts seconds."""
WAIT_RESOLUTION_MS = 0.05
"""A wait ends within about this much of its deadline (the spin after the sleep, `ppscope.engine.model`): an
embedding shorter than this joins the first layer's wait. Sampling, which the synthetic model does not wait for,
always joins the LM head's."""


@dataclass(frozen=True, kw_only=True)
class Emulation:
    """The waits that stand for a model's parts on a GPU, already scaled."""

    model: str
    """The preset whose shape is timed (e.g. llama3-8b)."""
    gpu: str
    """The GPU it is timed on (a name of the GPU table)."""
    scale: float
    """Every modelled time is multiplied by this (a factor; 20 = twenty times slower than the GPU)."""
    layer_ms: tuple[float, ...]
    """Each decoder layer's wait (ms, scaled)."""
    embed_ms: float
    """The embedding's wait (ms, scaled; 0 when it joined the first layer's)."""
    head_ms: float
    """The final norm + LM head's wait, sampling included (ms, scaled)."""

    def text(self) -> str:
        return emulation_text(self.model, self.gpu, self.scale)


def emulation_text(model: str, gpu: str, scale: float) -> str:
    """What every page and line says of an emulated run: from what, at what scale."""
    return f"emulated {model} on {gpu} (roofline), ×{scale:g} slower"


def emulation(model: str, gpu: str, *, stages: int, batch: int, context: int, scale: float = 0.0) -> Emulation:
    """The waits of `model` on `gpu` for a decode pass of `batch` sequences of `context` tokens, scaled by `scale`
    (0: the whole number that makes a stage's mean step about `MEAN_STAGE_MS` over `stages` stages, so the
    factor does not depend on the split and both runs of a comparison get the same one)."""
    model = RENAMED.get(model, model)
    if model not in PRESETS:
        raise InvalidConfigError(
            ErrorCode.UNKNOWN_CHOICE, f"emulate.model {model!r} is not a model preset; valid: {', '.join(PRESETS)}"
        )
    if not (math.isfinite(scale) and scale >= 0):
        raise InvalidConfigError(
            ErrorCode.BAD_VALUE, f"emulate.scale must be a finite factor >= 0 (0: chosen), got {scale}"
        )
    costs = model_costs(ModelShape.from_name(model), gpu_named(gpu), Workload(batch=batch, context=context))
    parts = costs.layer_costs()
    if scale == 0:
        total_ms = sum(parts.layer_ms) + parts.embed_ms + parts.head_ms + parts.sample_ms
        scale = float(max(1, round(MEAN_STAGE_MS * stages / total_ms)))
    layer_ms = [ms * scale for ms in parts.layer_ms]
    embed_ms, head_ms, sample_ms = parts.embed_ms * scale, parts.head_ms * scale, parts.sample_ms * scale
    if embed_ms < WAIT_RESOLUTION_MS:
        layer_ms[0] += embed_ms
        embed_ms = 0.0
    return Emulation(
        model=model, gpu=gpu, scale=scale, layer_ms=tuple(layer_ms), embed_ms=embed_ms, head_ms=head_ms + sample_ms
    )
