"""Build one rank's stage module from the layer counts: the chunks it holds, plus the embedding on the first
stage and the final norm + LM head on the last.

Chunk c of rank r of P ranks is virtual stage c*P + r; `split` gives layer counts per virtual stage
(P x V entries). This is the only place that maps layers to ranks; the model itself knows nothing of it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ppscope.balance.split import stage_layer_ranges, validate_split
from ppscope.engine.model import Batch, KVCache, LayerSource, Rotary, SyntheticLayer, sleep_ms

__all__ = ["Chunk", "LayerTimer", "StageModule", "build_stage"]

LayerTimer = Callable[[int], AbstractContextManager[Any]]
"""Given a decoder layer's index (the model's numbering), a context that times the work of that layer."""


@dataclass
class Chunk:
    """The contiguous layers of one virtual stage, with their KV caches."""

    stage: int
    """Virtual stage index."""
    first_layer: int
    layers: list[nn.Module]
    caches: list[KVCache] = field(default_factory=list)
    synthetic_ms: float = 0.0
    """Total time of the chunk's synthetic layers (0 for real layers)."""


class StageModule:
    """What rank `rank` holds: its chunks by chunk index, and embedding/head when it has the ends."""

    def __init__(
        self,
        *,
        rank: int,
        ranks: int,
        chunks: dict[int, Chunk],
        embed: nn.Module | None,
        head: nn.Module | None,
        synthetic: bool,
        device: torch.device,
        rotary: Rotary | None = None,
    ) -> None:
        self.rank = rank
        self.ranks = ranks
        self.chunks = chunks
        self.embed = embed
        self.head = head
        self.synthetic = synthetic
        self.device = device
        self.rotary = rotary
        """The model's rotary embedding (real layers only)."""

    def allocate_cache(self, slots: int, max_len: int, dtype: torch.dtype, kv_heads: int, head_dim: int) -> None:
        if self.synthetic:
            return
        for chunk in self.chunks.values():
            chunk.caches = [KVCache(slots, max_len, kv_heads, head_dim, dtype, self.device) for _ in chunk.layers]

    def warm_up(self, seqs: int, prompt_len: int, hidden: int, vocab: int, dtype: torch.dtype) -> torch.Tensor | None:
        """One untimed prefill of `seqs` prompts of `prompt_len` tokens and one decode step through everything this
        rank holds, before the run starts: the first call of each kernel is slow (the CPU's math library picks
        and builds its kernels, a GPU loads them), 0.2-0.7 s for the tiny model on a CPU, and left in the run it
        lands in one stage's first pass, as a serving engine's warm-up keeps it out of its first requests. The
        caches are zeroed after. Returns the last logits (the sampler's warm-up), None without a head."""
        if self.synthetic or seqs < 1 or prompt_len < 1:
            return None
        slots = list(range(seqs))
        logits = None
        for batch in (Batch(slots, [0] * seqs, [prompt_len] * seqs), Batch(slots, [prompt_len] * seqs, [1] * seqs)):
            x = torch.zeros(batch.tokens, hidden, dtype=dtype, device=self.device)
            if self.embed is not None:
                x = self.run_embed(torch.zeros(batch.tokens, dtype=torch.int64, device=self.device), hidden, dtype)
            for c in sorted(self.chunks):
                x = self.run_chunk(c, x, batch)
            if self.head is not None:
                logits = self.run_head(x, batch, vocab)
        for chunk in self.chunks.values():
            for cache in chunk.caches:
                cache.k.zero_()
                cache.v.zero_()
        return logits

    def run_embed(self, ids: torch.Tensor, hidden: int, dtype: torch.dtype) -> torch.Tensor:
        assert self.embed is not None
        if isinstance(self.embed, SyntheticLayer):
            sleep_ms(self.embed.cost_ms, self.device)
            return torch.zeros(ids.shape[0], hidden, dtype=dtype, device=self.device)
        out: torch.Tensor = self.embed(ids)
        return out

    def run_chunk(self, c: int, x: torch.Tensor, batch: Batch, timer: LayerTimer | None = None) -> torch.Tensor:
        """Chunk `c`'s layers on `x`; with a `timer`, each layer inside the context it gives for its index (the
        synthetic layers then take their time one by one)."""
        chunk = self.chunks[c]
        if self.synthetic:
            if timer is None:
                sleep_ms(chunk.synthetic_ms, self.device)
                return x
            for i, layer in enumerate(chunk.layers, chunk.first_layer):
                with timer(i):
                    sleep_ms(getattr(layer, "cost_ms", 0.0), self.device)
            return x
        assert self.rotary is not None
        index = batch.index(self.device, self.rotary, x.dtype)
        if timer is None:
            for layer, cache in zip(chunk.layers, chunk.caches, strict=True):
                x = layer(x, index, cache)
            return x
        for i, (layer, cache) in enumerate(zip(chunk.layers, chunk.caches, strict=True), chunk.first_layer):
            with timer(i):
                x = layer(x, index, cache)
        return x

    def run_head(self, x: torch.Tensor, batch: Batch, vocab: int) -> torch.Tensor:
        assert self.head is not None
        if isinstance(self.head, SyntheticLayer):
            # logits of one entry (every token is 0): sampling them costs next to nothing, so the last stage
            # takes the head's configured time and no more
            sleep_ms(self.head.cost_ms, self.device)
            return torch.zeros(len(batch.lens), 1, device=self.device)
        logits: torch.Tensor = self.head(x, batch)
        return logits


def build_stage(
    source: LayerSource, split: list[int], rank: int, ranks: int, chunks: int, device: torch.device, dtype: torch.dtype
) -> StageModule:
    """Build only the layers of `rank`'s chunks (virtual stages rank, rank + P, ...)."""
    virtual = ranks * chunks
    validate_split(split, source.shape.layers, virtual)
    ranges = stage_layer_ranges(split)
    held: dict[int, Chunk] = {}
    for c in range(chunks):
        vs = c * ranks + rank
        start, end = ranges[vs]
        # each layer is built in float32 and converted at once: the rank never holds its layers in float32
        layers = [source.layer(i).to(device=device, dtype=dtype).eval() for i in range(start, end)]
        cost = sum(getattr(layer, "cost_ms", 0.0) for layer in layers) if source.synthetic else 0.0
        held[c] = Chunk(stage=vs, first_layer=start, layers=layers, synthetic_ms=cost)
    embed = source.embedding().to(device=device, dtype=dtype).eval() if rank == 0 else None
    head = source.head().to(device=device, dtype=dtype).eval() if rank == (virtual - 1) % ranks else None
    rotary = None if source.synthetic else Rotary(source.shape, device)
    return StageModule(
        rank=rank,
        ranks=ranks,
        chunks=held,
        embed=embed,
        head=head,
        synthetic=source.synthetic,
        device=device,
        rotary=rotary,
    )
