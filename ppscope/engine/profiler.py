"""Per-layer cost profile: time each decoder layer, the embedding and the LM head + sampling on the device.

The result goes to the run directory as `profile.json`, which `ppscope.balance.measured.profile` reads without torch;
this module knows nothing about how the costs are used. Why each timed pass starts from cold caches and why
every decoder layer gets the median of all of them: docs/ARCHITECTURE.md, "The per-layer profile".
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ppscope.balance.measured.profile import PROFILE_FILE, LayerProfile, PhaseCosts
from ppscope.engine.config import EngineConfig
from ppscope.engine.model import Batch, KVCache, PassIndex, Rotary, sleep_ms
from ppscope.engine.prepare import batching, make_source, torch_dtype
from ppscope.engine.sampling import Sampling, row_keys, sample
from ppscope.engine.stage import StageModule
from ppscope.trace.model import Phase

__all__ = ["profile_layers", "write_profile"]


def _timer(device: torch.device) -> Callable[[Callable[[], Any]], float]:
    """A function that runs `fn` once and returns its duration in ms on `device`."""
    if device.type == "cuda":

        def cuda_ms(fn: Callable[[], Any]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end))

        return cuda_ms

    def cpu_ms(fn: Callable[[], Any]) -> float:
        t0 = time.perf_counter_ns()
        fn()
        return (time.perf_counter_ns() - t0) / 1e6

    return cpu_ms


class _Timer:
    """Runs a pass and returns its median duration in ms on `device`; with `flush_bytes`, each timed pass
    starts from cold caches."""

    def __init__(self, device: torch.device, flush_bytes: int) -> None:
        self.time = _timer(device)
        self._junk = torch.empty(flush_bytes, dtype=torch.uint8, device=device) if flush_bytes else None

    def flush(self) -> None:
        if self._junk is not None:
            self._junk.add_(1)  # read and write every line: the cache then holds nothing of the pass's data

    def median_ms(self, fn: Callable[[], Any], warmup: int, repeats: int) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            self.flush()  # on a GPU this is queued before the start event, so it is not timed
            times.append(self.time(fn))
        return statistics.median(times)


def cache_flush_bytes(device: torch.device) -> int:
    """Twice the largest cache in front of `device`'s memory: the L2 of a GPU, the last-level cache of a CPU
    (from sysfs, at most 1 GiB; 64 MiB where it cannot be read)."""
    if device.type == "cuda":
        l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
        return 2 * l2 if l2 > 0 else 256 << 20
    largest, units = 0, {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    for size in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = size.read_text().strip()
        except OSError:
            continue
        if text[:-1].isdigit() and text[-1] in units:
            largest = max(largest, int(text[:-1]) * units[text[-1]])
        elif text.isdigit():
            largest = max(largest, int(text))
    return min(2 * largest, 1 << 30) if largest else 64 << 20  # sysfs gives one L3 instance (a CCX), not all


def _profile(
    cfg: EngineConfig, device: torch.device, batches: dict[str, Batch], *, warmup: int, repeats: int, flush_bytes: int
) -> dict[str, PhaseCosts]:
    """PhaseCosts per kind of pass. Each module is built (read from a checkpoint) once and timed for every
    pass while it is in memory, one decoder layer at a time."""
    shape = cfg.model.shape()
    dtype = torch_dtype(cfg.model.dtype)
    source = make_source(cfg, shape)
    timer = _Timer(device, flush_bytes)
    work = cfg.workload
    gen = torch.Generator().manual_seed(work.seed)
    sampling = Sampling(temperature=work.temperature, top_p=work.top_p, seed=work.seed)
    layer_ms: dict[str, list[float]] = {name: [] for name in batches}
    with torch.inference_mode():
        ends = _ends(source, device, dtype)
        ids = {n: torch.randint(0, shape.vocab, (b.tokens,), generator=gen).to(device) for n, b in batches.items()}
        x = {n: ends.run_embed(ids[n], shape.hidden, dtype) for n in batches}
        rotary = Rotary(shape, device)
        index = {n: b.index(device, rotary, dtype) for n, b in batches.items()}
        for i in range(shape.layers):
            layer = source.layer(i).to(device=device, dtype=dtype).eval()
            for n, batch in batches.items():
                if source.synthetic:
                    run = functools.partial(sleep_ms, float(getattr(layer, "cost_ms", 0.0)), device)
                    layer_ms[n].append(timer.median_ms(run, warmup, repeats))
                    continue
                max_len = max(st + ln for st, ln in zip(batch.starts, batch.lens, strict=True))
                cache = KVCache(max(batch.slots) + 1, max_len, shape.kv_heads, shape.head_dim, dtype, device)
                layer_ms[n].append(timer.median_ms(_bind(layer, x[n], index[n], cache), warmup, repeats))
                del cache
            del layer
        phases = {}
        for n, batch in batches.items():
            each = tuple(layer_ms[n])
            if not source.synthetic:  # one shape for every decoder layer: they differ only by the machine's noise
                layer_ms[n] = [statistics.median(each)] * len(each)
            logits = ends.run_head(x[n], batch, shape.vocab)
            embed = functools.partial(ends.run_embed, ids[n], shape.hidden, dtype)
            head = functools.partial(ends.run_head, x[n], batch, shape.vocab)
            positions = [start + length for start, length in zip(batch.starts, batch.lens, strict=True)]
            keys = row_keys(work.seed, batch.seq_ids(), positions) if sampling.temperature > 0 else None
            pick = functools.partial(sample, logits, sampling, keys)
            phases[n] = PhaseCosts(
                layer_ms=tuple(layer_ms[n]),
                embed_ms=timer.median_ms(embed, warmup, repeats),
                head_ms=timer.median_ms(head, warmup, repeats),
                sample_ms=timer.median_ms(pick, warmup, repeats),
                tokens=batch.tokens,
                layer_ms_each=() if source.synthetic else each,
            )
    return phases


def _bind(layer: Any, x: torch.Tensor, index: PassIndex, cache: KVCache) -> Callable[[], Any]:
    return lambda: layer(x, index, cache)


def _ends(source: Any, device: torch.device, dtype: torch.dtype) -> StageModule:
    """A one-rank stage module holding only the embedding and the head: no decoder layer is built."""
    embed = source.embedding().to(device=device, dtype=dtype).eval()
    head = source.head().to(device=device, dtype=dtype).eval()
    return StageModule(rank=0, ranks=1, chunks={}, embed=embed, head=head, synthetic=source.synthetic, device=device)


def profile_layers(
    cfg: EngineConfig,
    *,
    prefill_tokens: int | None = None,
    decode_batch: int | None = None,
    warmup: int = 2,
    repeats: int = 5,
    device: str | None = None,
    cold: bool = True,
) -> LayerProfile:
    """Time every layer and both ends for a prefill and a decode pass shaped as the run's micro-batches: as
    many sequences as a micro-batch holds, each of the requests' mean prompt length (or one sequence of
    `prefill_tokens`), and a decode step of that many (or `decode_batch`) sequences halfway through their
    generation; each pass from cold caches unless `cold` is False (for comparison: passes back to back)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    shape = cfg.model.shape()
    run = batching(cfg, shape)
    if cfg.workload.prompts:
        prompt = round(statistics.mean(len(r.prompt_ids) for r in run.requests))
        new = statistics.mean(r.max_new_tokens for r in run.requests)
    else:  # generated alike, and made only when taken
        prompt, new = cfg.workload.prompt_len, cfg.workload.max_new_tokens
    seqs = run.max_seqs
    b = decode_batch or seqs
    if prefill_tokens:
        prefill = Batch(slots=[0], starts=[0], lens=[prefill_tokens])
    else:
        prefill = Batch(slots=list(range(seqs)), starts=[0] * seqs, lens=[prompt] * seqs)
    # a decode step halfway through the generation: attention reads the mean context of the run's steps
    context = min(round(prompt + new / 2), shape.max_seq_len - 1)
    decode = Batch(slots=list(range(b)), starts=[context] * b, lens=[1] * b)
    flush_bytes = cache_flush_bytes(dev) if cold and not cfg.model.synthetic else 0  # a sleep has nothing in cache
    threads = torch.get_num_threads()
    if dev.type == "cpu":  # as many threads as each rank of the pipeline gets (ppscope.engine.worker does the same)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // cfg.pipeline.stages))
    try:
        batches = {Phase.PREFILL.value: prefill, Phase.DECODE.value: decode}
        phases = _profile(cfg, dev, batches, warmup=warmup, repeats=repeats, flush_bytes=flush_bytes)
    finally:
        torch.set_num_threads(threads)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return LayerProfile(
        model=shape.name,
        device=name,
        dtype=cfg.model.dtype,
        method="cuda-events" if dev.type == "cuda" else "perf_counter",
        repeats=repeats,
        cache_flush_bytes=flush_bytes,
        prefill=phases[Phase.PREFILL],
        decode=phases[Phase.DECODE],
    )


def write_profile(profile: LayerProfile, run_dir: str | Path) -> Path:
    """Store the profile beside the run's spans (never over an existing one)."""
    path = Path(run_dir) / PROFILE_FILE
    with open(path, "x") as f:
        json.dump(profile.to_dict(), f, indent=2)
    return path
