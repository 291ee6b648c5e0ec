"""A Llama-style decoder: embedding, RMSNorm, rotary attention with grouped KV heads and a KV cache, SwiGLU MLP,
final norm and LM head; plus synthetic layers that only take a configured time.

The model knows nothing about pipelining: layers are built one by one from a `LayerSource` (random
weights seeded per layer, a Hugging Face checkpoint, or synthetic costs) and `ppscope.engine.stage` assembles the
ones a rank holds. Tokens of a batch are packed: `(N, D)` for N tokens of B sequences, described by a
`Batch` (cache slot, start position and length of each sequence). Parameter names follow Hugging Face's
Llama so a checkpoint loads by name.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from ppscope.balance.modelled.shapes import ModelShape, RopeScaling
from ppscope.trace.model import Phase

__all__ = [
    "Batch",
    "DecoderLayer",
    "Embedding",
    "Head",
    "KVCache",
    "LayerSource",
    "PassIndex",
    "RMSNorm",
    "RandomSource",
    "Rotary",
    "SyntheticLayer",
    "SyntheticSource",
    "calibrate_sleep",
    "settled_rate",
    "sleep_ms",
]


@dataclass
class Batch:
    """Which sequences the packed tokens belong to. Sequence b owns tokens [offset_b, offset_b + lens[b])."""

    slots: list[int]
    """KV-cache slot of each sequence."""
    starts: list[int]
    """Position of each sequence's first token in this pass (0 for a prefill)."""
    lens: list[int]
    """Tokens of each sequence in this pass (the prompt length for a prefill, 1 for a decode step)."""
    seqs: list[int] = field(default_factory=list)
    """Request id of each sequence, what its sampling is keyed by; empty: the same as `slots`."""

    def seq_ids(self) -> list[int]:
        return self.seqs or self.slots

    @property
    def phase(self) -> str:
        """`prefill` when the pass holds a prompt (a sequence starting at position 0), else `decode`."""
        return Phase.PREFILL if 0 in self.starts else Phase.DECODE

    @property
    def tokens(self) -> int:
        return sum(self.lens)

    def index(self, device: torch.device, rotary: Rotary, dtype: torch.dtype) -> PassIndex:
        """What every layer of a pass needs to know about its tokens: computed once per pass, not per layer."""
        lens = torch.tensor(self.lens)
        seq = torch.repeat_interleave(torch.arange(len(self.lens)), lens)
        t = torch.arange(self.tokens) - (lens.cumsum(0) - lens)[seq]
        starts = torch.tensor(self.starts)
        pos = to_device(starts[seq] + t, device)
        t_max, kv_len = max(self.lens), max(s + n for s, n in zip(self.starts, self.lens, strict=True))
        # query j of sequence b (padded to t_max) sees the cached keys up to its own position
        qpos = starts[:, None] + torch.arange(t_max)[None, :]
        mask = to_device((torch.arange(kv_len)[None, None, :] <= qpos[:, :, None])[:, None], device)  # (B,1,T,S)
        cos, sin = rotary.cos_sin(pos, dtype)
        slots = to_device(torch.tensor(self.slots), device)
        return PassIndex(
            seq=to_device(seq, device),
            t=to_device(t, device),
            pos=pos,
            slots=slots,
            cos=cos,
            sin=sin,
            mask=mask,
            t_max=t_max,
            kv_len=kv_len,
            dense=min(self.lens) == t_max,
        )


class PassIndex(NamedTuple):
    """A pass's tokens as every layer sees them (see `Batch.index`)."""

    seq: torch.Tensor
    """(N,) the sequence of each packed token."""
    t: torch.Tensor
    """(N,) each token's index within its sequence's part of the pass."""
    pos: torch.Tensor
    """(N,) each token's absolute position."""
    slots: torch.Tensor
    """(B,) each sequence's cache slot."""
    cos: torch.Tensor
    """(N, 1, hd) rotary cosines of the tokens' positions."""
    sin: torch.Tensor
    mask: torch.Tensor
    """(B, 1, T, S) which cached keys each (padded) query sees."""
    t_max: int
    kv_len: int
    dense: bool
    """Every sequence has t_max tokens here (a decode step): the packed tokens are already (B, T), no padding."""


class Rotary:
    """A model's rotary position embedding: its frequencies fixed once, scaled as its config says."""

    def __init__(self, shape: ModelShape, device: torch.device) -> None:
        hd = shape.head_dim
        inv_freq = 1.0 / (shape.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        scaling = shape.rope_scaling
        if scaling is not None and scaling.kind == "linear":
            inv_freq = inv_freq / scaling.factor
        elif scaling is not None and scaling.kind == "llama3":
            inv_freq = _llama3_frequencies(inv_freq, scaling)
        self.inv_freq = inv_freq.to(device)

    def cos_sin(self, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape (N, 1, hd) in Hugging Face's half-split convention."""
        freqs = pos.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


def _llama3_frequencies(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """Llama 3.1's scaling: wavelengths longer than the pretraining context / low_freq_factor are stretched by
    `factor`, those shorter than it / high_freq_factor are kept, and the ones between blend the two smoothly."""
    old = scaling.original_max_position
    wavelen = 2 * math.pi / inv_freq
    slow = inv_freq / scaling.factor
    smooth = (old / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - smooth) * slow + smooth * inv_freq
    out = torch.where(wavelen > old / scaling.low_freq_factor, slow, inv_freq)
    between = (wavelen >= old / scaling.high_freq_factor) & (wavelen <= old / scaling.low_freq_factor)
    return torch.where(between, blended, out)


class KVCache:
    """Keys and values of one layer for `slots` sequences of up to `max_len` tokens: (S, max_len, KV, hd)."""

    def __init__(
        self, slots: int, max_len: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device
    ):
        self.k = torch.zeros(slots, max_len, kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.max_len = max_len


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        d, h, kv, hd = shape.hidden, shape.heads, shape.kv_heads, shape.head_dim
        self.heads, self.kv_heads, self.head_dim = h, kv, hd
        self.q_proj = nn.Linear(d, h * hd, bias=False)
        self.k_proj = nn.Linear(d, kv * hd, bias=False)
        self.v_proj = nn.Linear(d, kv * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, d, bias=False)

    def forward(self, x: torch.Tensor, index: PassIndex, cache: KVCache) -> torch.Tensor:
        n, b = x.shape[0], index.slots.shape[0]
        q = self.q_proj(x).view(n, self.heads, self.head_dim)  # (N, H, hd)
        k = self.k_proj(x).view(n, self.kv_heads, self.head_dim)  # (N, KV, hd)
        v = self.v_proj(x).view(n, self.kv_heads, self.head_dim)
        q = q * index.cos + _rotate_half(q) * index.sin
        k = k * index.cos + _rotate_half(k) * index.sin
        rows = index.slots[index.seq]
        cache.k[rows, index.pos] = k
        cache.v[rows, index.pos] = v
        # The packed queries as (B, T, H, hd), padded unless every sequence has T tokens here; padded queries
        # see key 0 only and are dropped afterwards. Each attends to its sequence's cached keys up to its own
        # position, the KV heads shared by groups of query heads.
        if index.dense:
            qp = q.view(b, index.t_max, self.heads, self.head_dim)
        else:
            qp = x.new_zeros(b, index.t_max, self.heads, self.head_dim)
            qp[index.seq, index.t] = q
        keys = cache.k[index.slots, : index.kv_len].transpose(1, 2)  # (B, KV, S, hd)
        values = cache.v[index.slots, : index.kv_len].transpose(1, 2)
        out = F.scaled_dot_product_attention(
            qp.transpose(1, 2), keys, values, attn_mask=index.mask, enable_gqa=self.heads != self.kv_heads
        ).transpose(1, 2)  # (B, T, H, hd)
        out = out.reshape(n, self.heads, self.head_dim) if index.dense else out[index.seq, index.t]
        return self.o_proj(out.reshape(n, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(shape.hidden, shape.intermediate, bias=False)
        self.up_proj = nn.Linear(shape.hidden, shape.intermediate, bias=False)
        self.down_proj = nn.Linear(shape.intermediate, shape.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(shape.hidden, shape.norm_eps)
        self.self_attn = Attention(shape)
        self.post_attention_layernorm = RMSNorm(shape.hidden, shape.norm_eps)
        self.mlp = MLP(shape)

    def forward(self, x: torch.Tensor, index: PassIndex, cache: KVCache) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), index, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class Embedding(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(shape.vocab, shape.hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids)


class Head(nn.Module):
    """Final norm and LM head, applied to the last token of each sequence only."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.norm = RMSNorm(shape.hidden, shape.norm_eps)
        self.lm_head = nn.Linear(shape.hidden, shape.vocab, bias=False)

    def forward(self, x: torch.Tensor, batch: Batch) -> torch.Tensor:
        last = to_device(torch.tensor(batch.lens).cumsum(0) - 1, x.device)
        return self.lm_head(self.norm(x[last])).float()  # (B, vocab)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device` without making the host wait: to a GPU through pinned memory, asynchronously
    (a copy from pageable memory synchronises the stream, so the host could not queue a pass ahead)."""
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def sleep_ms(ms: float, device: torch.device) -> None:
    """Take `ms` of time: a host sleep on CPU, a spinning kernel on a GPU (so the GPU is busy, as in real work)."""
    if ms <= 0:
        return
    if device.type == "cuda":
        torch.cuda._sleep(int(ms * _cycles_per_ms(device)))
    else:
        _host_sleep(ms * 1e-3)


def _host_sleep(seconds: float) -> None:
    """Sleep `seconds`, ending on time: time.sleep wakes ~0.1 ms late (timer slack, wake-up), so sleep short
    of the deadline by the lateness seen so far plus a margin, then spin the rest (about the margin)."""
    deadline = time.perf_counter() + seconds
    ahead = seconds - _LATE_S[0] - _SPIN_MARGIN_S
    if ahead > 0:
        start = time.perf_counter()
        time.sleep(ahead)
        late = min(max(time.perf_counter() - start - ahead, 0.0), _LATE_MAX_S)
        _LATE_S[0] += 0.1 * (late - _LATE_S[0])
    while time.perf_counter() < deadline:
        pass


_LATE_S = [1e-4]
"""Running mean of how late time.sleep wakes up here (clipped, so one preemption does not make it spin)."""
_LATE_MAX_S = 3e-4
_SPIN_MARGIN_S = 5e-5
"""Spun on top of the expected lateness: covers its jitter."""
_CYCLES_PER_MS: dict[int, float] = {}
SLEEP_SAMPLE_CYCLES = 10_000_000
"""Cycles of one timed spin of the calibration (about 5-10 ms at today's SM clocks)."""


def calibrate_sleep(device: torch.device) -> float:
    """Measure the GPU sleep's clock now (before the run's clock starts), not inside the first pass; return
    it in cycles per ms (the SM clock in kHz), 0 on a CPU."""
    return _cycles_per_ms(device) if device.type == "cuda" else 0.0


def _cycles_per_ms(device: torch.device) -> float:
    """GPU clock cycles of `torch.cuda._sleep` per millisecond, measured once per device with CUDA events."""
    index = device.index or 0
    if index not in _CYCLES_PER_MS:
        with torch.cuda.device(device):
            _CYCLES_PER_MS[index] = settled_rate(_timed_sleep_ms)
    return _CYCLES_PER_MS[index]


def _timed_sleep_ms(cycles: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def settled_rate(
    timed_ms: Callable[[int], float],
    *,
    cycles: int = SLEEP_SAMPLE_CYCLES,
    warmup_ms: float = 100.0,
    tolerance: float = 0.01,
    tries: int = 50,
) -> float:
    """Cycles per ms of a spin that `timed_ms(cycles)` runs and times, once the clock it counts has settled.

    An idle GPU's SM clock ramps up when work comes, so a sample taken at once would scale every synthetic
    cost by the ramp: the spin first runs at least `warmup_ms`, then samples until two in a row agree within
    `tolerance` (their mean), or `tries` samples (the last)."""
    spent = 0.0
    while spent < warmup_ms:
        spent += max(timed_ms(cycles), 1e-3)
    last = cycles / max(timed_ms(cycles), 1e-3)
    for _ in range(tries):
        rate = cycles / max(timed_ms(cycles), 1e-3)
        if abs(rate - last) <= tolerance * last:
            return (rate + last) / 2
        last = rate
    return last


class SyntheticLayer(nn.Module):
    """A layer that computes nothing and takes `cost_ms` per pass, whatever the tokens."""

    def __init__(self, cost_ms: float) -> None:
        super().__init__()
        self.cost_ms = cost_ms


class LayerSource(Protocol):
    """Where a rank's modules come from. Each method builds only what it is asked for."""

    shape: ModelShape
    synthetic: bool

    def layer(self, index: int) -> nn.Module: ...

    def embedding(self) -> nn.Module: ...

    def head(self) -> nn.Module: ...


def _init_(module: nn.Module, seed: int) -> nn.Module:
    """Fill every parameter from a generator seeded for this module alone (built on the meta device, so the
    default initialisation is never paid for)."""
    module.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                p.fill_(1.0)
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0, generator=gen)
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]), generator=gen)
    return module


class RandomSource:
    """Random weights seeded per layer: layer i is the same whichever rank builds it, so any split of the
    model computes exactly what the unsplit model computes."""

    synthetic = False

    def __init__(self, shape: ModelShape, seed: int = 0) -> None:
        self.shape = shape
        self.seed = seed

    def layer(self, index: int) -> nn.Module:
        with torch.device("meta"):
            layer = DecoderLayer(self.shape)
        return _init_(layer, self.seed * 1_000_003 + index)

    def embedding(self) -> nn.Module:
        with torch.device("meta"):
            emb = Embedding(self.shape)
        return _init_(emb, self.seed * 1_000_003 - 1)

    def head(self) -> nn.Module:
        with torch.device("meta"):
            head = Head(self.shape)
        _init_(head, self.seed * 1_000_003 - 2)
        if self.shape.tie_embeddings:
            emb = self.embedding()
            assert isinstance(emb, Embedding)
            head.lm_head.weight = emb.embed_tokens.weight
        return head


class SyntheticSource:
    """Layers that only take time: `layer_cost_ms[i]` per pass of layer i, `embed_cost_ms`, `head_cost_ms`."""

    synthetic = True

    def __init__(self, shape: ModelShape, layer_cost_ms: list[float], embed_cost_ms: float, head_cost_ms: float):
        self.shape = shape
        self.layer_cost_ms = layer_cost_ms
        self.embed_cost_ms = embed_cost_ms
        self.head_cost_ms = head_cost_ms

    def layer(self, index: int) -> nn.Module:
        return SyntheticLayer(self.layer_cost_ms[index])

    def embedding(self) -> nn.Module:
        return SyntheticLayer(self.embed_cost_ms)

    def head(self) -> nn.Module:
        return SyntheticLayer(self.head_cost_ms)
