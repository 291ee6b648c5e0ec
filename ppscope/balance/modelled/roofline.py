"""Layer costs from the model's shape and the GPU's datasheet, with no run: a roofline per part of the model.

For one pass of a micro-batch (B sequences; C tokens of context each, in the KV cache for a decode step or in
the prompt for a prefill), each part (every decoder layer, the embedding, the LM head, sampling) costs, on one
GPU of a stage's tensor-parallel group of T:

    time = max(bytes it moves ÷ achieved memory bandwidth, FLOPs ÷ achieved dense FLOP/s) + its collectives

Achieved = the datasheet's peak × the share kernels were measured to reach on the GPU's family
(`ppscope.balance.modelled.gpus.Achieved`); `GPU.at_peak()` times everything at the datasheet's peaks.

- Bytes: the weights it reads (÷ T); for a MoE layer, the experts the batch's tokens reach (expected distinct
  experts of B·k draws, routing taken as uniform); the KV cache, B·C tokens read in decode and written in
  prefill (KV heads ÷ T, replicated when T exceeds them; a latent is cached whole on each GPU); the rows the
  embedding gathers; the fp32 logits the head writes and sampling reads (one row per sequence: vLLM computes
  logits only where a token is sampled).
- FLOPs: 2 per parameter a token goes through (a MoE token: the router, its k experts and any shared ones),
  plus attention over its context, causal in prefill; ÷ T. Latent attention runs absorbed in decode (keys
  kv_lora_rank + rope wide, values kv_lora_rank), expanded in prefill.
- Collectives (T > 1): two all-reduces per layer (after attention and after the MLP) and one after the
  embedding, of tokens x hidden in BF16, taking 2(T-1)/T x bytes ÷ the one-way bandwidth a GPU has to its
  T - 1 peers (through a switch, all of its port; in a mesh such as MI300X's, one link per peer) plus
  `ALLREDUCE_LATENCY_S` each; the head's logits are gathered to one GPU.

Decode of small batches is bound by memory (bytes ÷ bandwidth), prefill by compute (FLOPs ÷ peak): the max
picks whichever bound binds. `ModelCosts.layer_costs()` is the `LayerCosts` the rebalancer takes. It knows
kernels' efficiency only as one share per GPU family and resource (not per kernel or shape), nothing about
the hop between stages (the same at every stage boundary), fused or overlapped kernels, CUDA graphs, the
engine's scheduler, speculative decoding (DeepSeek-V3's MTP layer is left out) or what a real router does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ppscope.balance.costs import LayerCosts
from ppscope.balance.modelled.gpus import GPU
from ppscope.balance.modelled.shapes import ModelShape, dtype_bytes
from ppscope.errors import ErrorCode, InvalidConfigError
from ppscope.trace.actions import Phase

__all__ = [
    "ACTIVATION_BYTES",
    "ALLREDUCE_LATENCY_S",
    "LOGIT_BYTES",
    "PHASES",
    "ModelCosts",
    "PartCost",
    "Workload",
    "expected_experts",
    "model_costs",
    "rate_lines",
]

PHASES = (Phase.DECODE, Phase.PREFILL)
ACTIVATION_BYTES = 2
"""Activations move between GPUs in BF16 whatever the weights' dtype."""
LOGIT_BYTES = 4
"""Logits are fp32 for sampling."""
ALLREDUCE_LATENCY_S = 8e-6
"""Fixed time of one all-reduce within a node, s: assumed (a typical small-message NCCL or vLLM custom
all-reduce takes a few to ten µs), not from a datasheet."""


@dataclass(frozen=True, kw_only=True)
class Workload:
    """The pass whose cost is modelled: one micro-batch through the model."""

    phase: str = Phase.DECODE
    """`decode`: one new token per sequence; `prefill`: every prompt token at once."""
    batch: int = 16
    """Sequences in the micro-batch."""
    context: int = 2048
    """Tokens per sequence: already in the KV cache (decode) or in the prompt (prefill)."""
    dtype: str = "bf16"
    """Weights and KV cache."""
    tp: int = 1
    """Tensor-parallel GPUs in each stage."""

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise InvalidConfigError(
                ErrorCode.UNKNOWN_CHOICE, f"the cost model has phases {', '.join(PHASES)}, not {self.phase!r}"
            )
        for name in ("batch", "context", "tp"):
            if getattr(self, name) < 1:
                raise InvalidConfigError(ErrorCode.BAD_VALUE, f"--{name} must be >= 1, got {getattr(self, name)}")
        dtype_bytes(self.dtype)

    @property
    def tokens(self) -> int:
        """Tokens the pass computes: one per sequence in decode, the whole prompt in prefill."""
        return self.batch if self.phase == Phase.DECODE else self.batch * self.context


@dataclass(frozen=True, kw_only=True)
class PartCost:
    """What one part of the model costs per pass on one GPU of its stage."""

    weight_bytes: float
    """Weights read, bytes."""
    kv_bytes: float
    """KV cache read (decode) or written (prefill), bytes."""
    other_bytes: float
    """Embedding rows gathered, logits written or read, bytes."""
    flops: float
    """Floating-point operations (a multiply-add is 2)."""
    comm_bytes: float
    """Each GPU's message in the collectives, bytes (0 without TP)."""
    memory_ms: float
    """Bytes moved ÷ memory bandwidth, ms."""
    compute_ms: float
    """FLOPs ÷ the dense peak at the dtype, ms."""
    comm_ms: float
    """Collectives across the TP group, ms."""

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes + self.other_bytes

    @property
    def ms(self) -> float:
        """The part's time: the binding bound plus its collectives."""
        return max(self.memory_ms, self.compute_ms) + self.comm_ms

    @property
    def bound(self) -> str:
        return "memory" if self.memory_ms >= self.compute_ms else "compute"

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "bytes": self.bytes, "ms": self.ms, "bound": self.bound}


@dataclass(frozen=True, kw_only=True)
class ModelCosts:
    """Per-part costs of one pass of a model on a GPU, and the assumptions behind them."""

    shape: ModelShape
    gpu: GPU
    workload: Workload
    layers: tuple[PartCost, ...]
    """Each decoder layer, in model order."""
    embed: PartCost
    head: PartCost
    """Final norm + LM head."""
    sample: PartCost

    def layer_costs(self) -> LayerCosts:
        """The rebalancer's costs: ms per pass of every layer, the embedding, the head and sampling."""
        return LayerCosts(
            layer_ms=tuple(p.ms for p in self.layers),
            embed_ms=self.embed.ms,
            head_ms=self.head.ms,
            sample_ms=self.sample.ms,
        )

    def assumptions(self) -> list[str]:
        """Every assumption the figures rest on, in words."""
        g, w, m = self.gpu, self.workload, self.shape
        out = [
            *rate_lines(g, w.dtype),
            f"{w.phase}: {w.batch} sequence(s) per micro-batch, {w.context} tokens of "
            + ("context each in the KV cache" if w.phase == Phase.DECODE else "prompt each, causal attention"),
            f"weights and KV cache in {w.dtype}; activations cross GPUs in BF16; logits in fp32",
            "time of a part = max(bytes moved ÷ achieved bandwidth, FLOPs ÷ achieved FLOP/s) + its collectives; "
            "kernels neither "
            "fuse nor overlap, and the hop between stages (the same at every boundary) is left out",
            "the LM head computes logits for one token per sequence (where a token is sampled); sampling reads "
            "them once",
        ]
        if w.tp > 1:
            out.append(
                f"TP={w.tp} divides weights, FLOPs and KV heads (KV heads replicated when TP exceeds them"
                + ("; the latent KV cache is whole on every GPU" if m.mla else "")
                + f"); two all-reduces per layer and one after the embedding over {g.link}: "
                f"{g.peer_bandwidth(w.tp - 1) / 1e9:g} GB/s each way to the other {w.tp - 1} GPU(s)"
                + (f" ({min(w.tp - 1, g.peer_links)} link(s) of the mesh)" if g.topology == "mesh" else "")
                + f", plus {ALLREDUCE_LATENCY_S * 1e6:g} µs each (assumed)"
            )
        if m.moe is not None:
            out.append(
                f"mixture of experts: each token goes to {m.moe.per_token} of {m.moe.experts} experts"
                + (f" and {m.moe.shared} shared" if m.moe.shared else "")
                + f"; routing taken as uniform, so a micro-batch of {w.tokens} token(s) reads "
                f"{expected_experts(m.moe.experts, m.moe.per_token, w.tokens):.1f} experts' weights per layer"
                + (f"; the first {m.moe.dense_layers} layer(s) are dense" if m.moe.dense_layers else "")
            )
        if m.mla is not None:
            out.append(
                f"latent attention: {m.mla.kv_lora_rank} + {m.mla.qk_rope_head_dim} cached values per token per "
                "layer; "
                + (
                    f"decode runs it absorbed (as vLLM and SGLang do): each head's keys are "
                    f"{m.mla.kv_lora_rank + m.mla.qk_rope_head_dim} wide and its values {m.mla.kv_lora_rank}"
                    if w.phase == Phase.DECODE
                    else f"prefill expands it into per-head keys of "
                    f"{m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim} and values of {m.mla.v_head_dim}"
                )
            )
        if m.sliding_window:
            out.append(f"every layer attends to its last {m.sliding_window} tokens (sliding window)")
        return out

    def to_dict(self) -> dict[str, Any]:
        w = self.workload
        return {
            "model": self.shape.name,
            "gpu": dataclasses.asdict(self.gpu),
            "phase": w.phase,
            "batch": w.batch,
            "context": w.context,
            "dtype": w.dtype,
            "tp": w.tp,
            "layers": [p.to_dict() for p in self.layers],
            "embed": self.embed.to_dict(),
            "head": self.head.to_dict(),
            "sample": self.sample.to_dict(),
            "assumptions": self.assumptions(),
        }


def rate_lines(gpu: GPU, dtype: str) -> list[str]:
    """The rates the model times parts at, each with where it comes from: the datasheet's peak × the share
    kernels were measured to reach on the GPU's family, or the peak alone where nothing was measured."""
    a = gpu.achieved
    peak = gpu.peak_flops(dtype) / 1e12
    widened = "" if gpu.fp8_tflops or dtype != "fp8" else " (no FP8 tensor cores: the BF16 peak)"
    return [
        f"{gpu.name} ({gpu.family}), from the {gpu.source}",
        f"memory: {gpu.memory_tb_per_s:g} TB/s × {a.memory:g} achieved = {gpu.bandwidth / 1e12:.3g} TB/s "
        f"({a.memory_source})",
        f"tensor compute at {dtype}: {peak:g} TFLOPS dense{widened} × {a.compute:g} achieved = "
        f"{gpu.achieved_flops(dtype) / 1e12:.4g} TFLOPS ({a.compute_source})",
        f"interconnect: {gpu.link_gb_per_s:g} GB/s each way per "
        + ("peer link" if gpu.topology == "mesh" else "GPU")
        + f" × {a.link:g} achieved ({a.link_source})",
    ]


def expected_experts(experts: int, per_token: int, tokens: int) -> float:
    """Distinct experts that `tokens` tokens reach when each picks `per_token` of `experts` uniformly:
    an expert is missed by one token with probability 1 - k/E, by all of them with (1 - k/E)^tokens."""
    return experts * (1.0 - (1.0 - per_token / experts) ** tokens)


def model_costs(shape: ModelShape, gpu: GPU, workload: Workload) -> ModelCosts:
    """The roofline cost of every part of `shape` on `gpu` for `workload` (see the module docstring)."""
    w = workload
    if shape.heads % w.tp:
        raise InvalidConfigError(
            ErrorCode.HEADS_NOT_DIVISIBLE, f"--tp {w.tp} does not divide {shape.name}'s {shape.heads} attention heads"
        )
    gpu.peak_flops(w.dtype)  # refuses a dtype without a peak before anything is computed
    return ModelCosts(
        shape=shape,
        gpu=gpu,
        workload=w,
        layers=tuple(_layer(shape, i, gpu, w) for i in range(shape.layers)),
        embed=_embed(shape, gpu, w),
        head=_head(shape, gpu, w),
        sample=_sample(shape, gpu, w),
    )


def _part(
    gpu: GPU,
    w: Workload,
    *,
    weights: float = 0,
    kv: float = 0,
    other: float = 0,
    flops: float = 0,
    comm_ms: float = 0.0,
    comm_bytes: float = 0,
) -> PartCost:
    moved = weights + kv + other
    return PartCost(
        weight_bytes=weights,
        kv_bytes=kv,
        other_bytes=other,
        flops=flops,
        comm_bytes=comm_bytes,
        memory_ms=moved / gpu.bandwidth * 1e3,
        compute_ms=flops / gpu.achieved_flops(w.dtype) * 1e3,
        comm_ms=comm_ms,
    )


def _allreduce_ms(gpu: GPU, tp: int, nbytes: float) -> float:
    """One all-reduce of `nbytes` per GPU across `tp` GPUs: 2(T-1)/T of it leaves each GPU, over the bandwidth
    it has to its T - 1 peers (a switch port's whole bandwidth; in a mesh, one link per peer)."""
    if tp == 1:
        return 0.0
    return (ALLREDUCE_LATENCY_S + 2 * (tp - 1) / tp * nbytes / gpu.peer_bandwidth(tp - 1)) * 1e3


def _attended(w: Workload, window: int) -> float:
    """(query, key) pairs one sequence's attention computes: C in decode, C(C+1)/2 in prefill (causal), each
    position seeing at most `window` keys when there is one."""
    c = w.context
    if w.phase == Phase.DECODE:
        return float(min(c, window) if window else c)
    if not window or window >= c:
        return c * (c + 1) / 2
    return window * (window + 1) / 2 + (c - window) * window


def _head_widths(shape: ModelShape, phase: str) -> tuple[int, int]:
    """Per-head widths of the query·key product and of the values. Latent attention in decode runs absorbed,
    as vLLM and SGLang run it: the key projection is folded into the query and the value projection into the
    output, so every head attends over the cached latent and rotary key (kv_lora_rank + rope wide) and reads
    the latent as its values; the folded projections cost what the layer's parameters already count. Prefill
    expands the latent into per-head keys and values (nope + rope, v_head_dim)."""
    if (m := shape.mla) is not None:
        if phase == Phase.DECODE:
            return m.kv_lora_rank + m.qk_rope_head_dim, m.kv_lora_rank
        return m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
    return shape.head_dim, shape.head_dim


def _layer(shape: ModelShape, layer: int, gpu: GPU, w: Workload) -> PartCost:
    wb, tp, tokens = dtype_bytes(w.dtype), w.tp, w.tokens
    params = float(shape.layer_params_at(layer))
    if (moe := shape.moe) is not None and shape.is_moe_layer(layer):
        unread = moe.experts - expected_experts(moe.experts, moe.per_token, tokens)
        params -= unread * moe.expert_params * shape.hidden
    kv = w.batch * w.context * shape.kv_bytes_per_token_per_layer_per_gpu(w.dtype, tp)
    if w.phase == Phase.DECODE and shape.sliding_window:
        kv = w.batch * min(w.context, shape.sliding_window) * shape.kv_bytes_per_token_per_layer_per_gpu(w.dtype, tp)
    qk, v = _head_widths(shape, w.phase)
    attention = 2 * w.batch * shape.heads * (qk + v) * _attended(w, shape.sliding_window)
    message = tokens * shape.hidden * ACTIVATION_BYTES
    return _part(
        gpu,
        w,
        weights=params * wb / tp,
        kv=kv,
        flops=(2 * tokens * shape.active_params(layer) + attention) / tp,
        comm_bytes=2 * message if tp > 1 else 0,
        comm_ms=2 * _allreduce_ms(gpu, tp, message),
    )


def _embed(shape: ModelShape, gpu: GPU, w: Workload) -> PartCost:
    """The rows of the tokens' ids, gathered from a vocabulary split over the TP group, then all-reduced."""
    message = w.tokens * shape.hidden * ACTIVATION_BYTES
    return _part(
        gpu,
        w,
        other=w.tokens * shape.hidden * dtype_bytes(w.dtype) / w.tp,
        comm_bytes=message if w.tp > 1 else 0,
        comm_ms=_allreduce_ms(gpu, w.tp, message),
    )


def _head(shape: ModelShape, gpu: GPU, w: Workload) -> PartCost:
    """Final norm and LM head for one token per sequence; each GPU's slice of the vocabulary is gathered."""
    logits = w.batch * shape.vocab * LOGIT_BYTES
    gather = (
        (ALLREDUCE_LATENCY_S + (w.tp - 1) / w.tp * logits / gpu.peer_bandwidth(w.tp - 1)) * 1e3 if w.tp > 1 else 0.0
    )
    return _part(
        gpu,
        w,
        weights=shape.head_params * dtype_bytes(w.dtype) / w.tp,
        other=logits / w.tp,
        flops=2 * w.batch * shape.hidden * shape.vocab / w.tp,
        comm_bytes=logits / w.tp if w.tp > 1 else 0,
        comm_ms=gather,
    )


def _sample(shape: ModelShape, gpu: GPU, w: Workload) -> PartCost:
    """One read of the fp32 logits on one GPU."""
    return _part(gpu, w, other=w.batch * shape.vocab * LOGIT_BYTES)
