"""Everything decided before any rank starts: model shape, layer split, requests, backend, run metadata.

Deterministic from the config, so the launcher (to fail early with one clear line) and every rank (to agree
without talking) compute the same answer.
"""

from __future__ import annotations

import functools
import math
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ppscope import __version__
from ppscope.balance.modelled.shapes import PRESETS, ModelShape
from ppscope.balance.split import resolve_split, stage_layer_ranges
from ppscope.engine.config import EngineConfig, PipelineConfig
from ppscope.engine.model import LayerSource, RandomSource, SyntheticSource
from ppscope.engine.requests import Request, generate_requests, load_prompts, poisson_arrivals_ns
from ppscope.errors import ErrorCode, InvalidConfigError, InvalidSplitError
from ppscope.trace.model import RunMeta
from ppscope.trace.schedules import Schedule

__all__ = [
    "Batching",
    "Prepared",
    "batching",
    "check_memory",
    "host_available_bytes",
    "make_source",
    "prepare",
    "resolve_backend",
    "torch_dtype",
]

_GIB = 1 << 30
PROCESS_BYTES = 400 << 20
"""What a rank's process takes besides its model: the interpreter, torch and the recorder (a synthetic rank
starts at about 215 MB resident, the soak benchmark measures), with room to spare."""


@dataclass(kw_only=True)
class Prepared:
    cfg: EngineConfig
    shape: ModelShape
    split: list[int]
    """Layer counts per virtual stage."""
    split_source: str
    requests: Sequence[Request]
    """Generated ones are made as the run takes them (`GeneratedRequests`)."""
    backend: str
    inflight: int
    """Micro-batches per step (gpipe/interleaved) or in flight (serve): the config's, but at most one per
    request, since a micro-batch holds at least one."""
    max_seqs: int
    """Most sequences in one micro-batch."""
    cache_slots: int
    """KV-cache rows each layer needs."""
    max_len: int
    """Longest sequence (prompt + output)."""
    longest_prompt: int
    """Longest prompt: a prefill's activations, the largest message a rank receives."""

    @functools.cached_property
    def arrivals_ns(self) -> Sequence[int]:
        """Arrival of each request after the start (serve): made when first asked for, by rank 0 alone."""
        work = self.cfg.workload
        rate = work.rate if self.cfg.pipeline.schedule == Schedule.SERVE else 0.0
        return poisson_arrivals_ns(len(self.requests), rate, work.seed)

    def rank_bytes(self, rank: int, world: int) -> tuple[int, int]:
        """Weights and KV cache `rank` of `world` allocates (0, 0 for the synthetic model)."""
        if self.cfg.model.synthetic:
            return 0, 0
        s, itemsize = self.shape, torch_dtype(self.cfg.model.dtype).itemsize
        layers = sum(self.split[c * world + rank] for c in range(self.cfg.pipeline.chunks))
        params = layers * s.layer_params
        params += s.embed_params if rank == 0 else 0
        params += s.head_params if rank == (len(self.split) - 1) % world else 0
        kv = layers * self.cache_slots * self.max_len * s.kv_bytes_per_token_per_layer(self.cfg.model.dtype)
        return params * itemsize, kv

    def meta(self, world: int) -> RunMeta:
        m, pipe = self.cfg.model, self.cfg.pipeline
        model = {**self.shape.to_dict(), "name": self.shape.name, "synthetic": m.synthetic, "source": m.name}
        if m.synthetic:
            model.update(layer_cost_ms=m.layer_costs_ms(), embed_cost_ms=m.embed_cost_ms, head_cost_ms=m.head_cost_ms)
        if self.cfg.emulate.on:  # every reader of the run says its timings are emulated, and from what
            model.update(emulated=self.cfg.emulate.text())
        # the flat form, keys as readers take them (requests, max_inflight, record, dtype), with what the run did:
        config = self.cfg.to_json()
        config["max_inflight"] = self.inflight if pipe.schedule == Schedule.SERVE else pipe.max_inflight
        config["microbatches"] = self.inflight if pipe.schedule != Schedule.SERVE else pipe.microbatches
        config["requests"] = len(self.requests)  # a prompts file's too: an interrupted run logs fewer
        return RunMeta(
            source="ppscope",
            status="running",
            world_size=world,
            pp_size=world,
            schedule=pipe.schedule,
            microbatches=self.inflight,
            chunks=pipe.chunks,
            split=list(self.split),
            split_source=self.split_source,
            model=model,
            backend=self.backend,
            versions={"ppscope": __version__, "torch": torch.__version__, "python": platform.python_version()},
            config=config,
        )


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}[
        name
    ]


def resolve_backend(requested: str, world: int, device: str = "auto") -> str:
    """This process's view of the backend, checked before any rank starts. `auto`: NCCL when this node shows a
    GPU for each of its ranks (under a launcher, LOCAL_WORLD_SIZE of the `world`), or one GPU to a rank under a
    launcher (a scheduler's binding of a GPU per process: SLURM, Kubernetes), else gloo. The ranks then settle
    one backend for the whole run on rank 0, from every rank's GPU (`ppscope.engine.binding`). `device` cpu
    means gloo; cuda needs a GPU (with gloo, ranks may share one)."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    bound = gpus == 1 and "LOCAL_WORLD_SIZE" in os.environ
    if device == "cuda" and gpus == 0:
        raise InvalidConfigError(
            ErrorCode.NO_GPU, "--device cuda needs an NVIDIA GPU and none is visible: use --device cpu"
        )
    if requested == "nccl" and gpus == 0:
        raise InvalidConfigError(
            ErrorCode.NO_GPU, "--backend nccl needs NVIDIA GPUs and none is visible: use --backend gloo (CPU)"
        )
    if requested == "nccl" and local > gpus and not bound:
        raise InvalidConfigError(
            ErrorCode.NO_GPU,
            f"--backend nccl needs a GPU per rank: {local} ranks on this node, {gpus} GPU(s) visible; "
            "use fewer --stages per node, or --backend gloo --device cuda to share the GPUs",
        )
    if requested == "auto":
        return "nccl" if device != "cpu" and gpus >= 1 and (local <= gpus or bound) else "gloo"
    return requested


def make_source(cfg: EngineConfig, shape: ModelShape) -> LayerSource:
    m = cfg.model
    if m.synthetic:
        return SyntheticSource(shape, m.layer_costs_ms(), m.embed_cost_ms, m.head_cost_ms)
    if m.name in PRESETS:
        return RandomSource(shape, cfg.workload.seed)
    from ppscope.engine.hf import CheckpointSource

    return CheckpointSource(m.name, shape)


def _check_synthetic_waits(cfg: EngineConfig, split: Sequence[int]) -> None:
    """Refuse synthetic costs under which a rank is sure to wait longer than --timeout for its first input (the
    last rank for what the stages before it do, rank 0 for what comes back), rather than find it out then."""
    stages, timeout_s = cfg.pipeline.stages, cfg.runtime.timeout_s
    if stages < 2:
        return
    per_layer = cfg.model.layer_costs_ms()
    stage_ms = [sum(per_layer[start:end]) for start, end in stage_layer_ranges(split)]  # in the order visited
    stage_ms[0] += cfg.model.embed_cost_ms
    stage_ms[-1] += cfg.model.head_cost_ms
    wait_s = max(sum(stage_ms[: stages - 1]), sum(stage_ms[1:stages])) / 1e3
    if wait_s >= timeout_s:
        raise InvalidConfigError(
            ErrorCode.TIMEOUT_TOO_SHORT,
            f"with these synthetic costs a rank waits {wait_s:.1f} s for its first message (the stages before it "
            f"in the ring take that long) but --timeout is {timeout_s:g} s: raise --timeout above {wait_s:.1f} "
            "or lower the costs",
        )


def _split(pipe: PipelineConfig, layers: int) -> tuple[list[int], str]:
    """The split of `layers` over the virtual stages and where it came from; with chunks, a refusal says how
    a split of virtual stages is laid out."""
    try:
        return resolve_split(pipe.split, layers, pipe.virtual_stages)
    except InvalidSplitError as exc:
        if pipe.chunks == 1:
            raise
        if pipe.split is None and layers < pipe.virtual_stages:
            raise InvalidSplitError(
                ErrorCode.TOO_FEW_LAYERS,
                f"{layers} layer(s) cannot be split over {pipe.stages} stages x {pipe.chunks} chunks "
                f"(each virtual stage needs at least one): use at most {max(layers // pipe.stages, 1)} chunks",
            ) from None
        raise InvalidSplitError(
            exc.code,
            f"{exc} (with --chunks {pipe.chunks} the split gives one count per virtual stage: "
            f"{pipe.stages} stages x {pipe.chunks} chunks = {pipe.virtual_stages} entries, "
            "ordered rank 0..P-1 for chunk 0, then for chunk 1, ...)",
        ) from None


def prepare(cfg: EngineConfig, world: int) -> Prepared:
    """Resolve the split, the requests and the backend; raise a named error for anything inconsistent."""
    pipe = cfg.pipeline
    if world != pipe.stages:
        raise InvalidConfigError(
            ErrorCode.WORLD_SIZE_MISMATCH,
            f"--stages {pipe.stages} but {world} ranks were started: "
            "under torchrun give --stages equal to the world size",
        )
    shape = cfg.model.shape()
    split, source = _split(pipe, shape.layers)
    if cfg.model.synthetic:
        _check_synthetic_waits(cfg, split)
    b = batching(cfg, shape)
    return Prepared(
        cfg=cfg,
        shape=shape,
        split=split,
        split_source=source,
        requests=b.requests,
        backend=resolve_backend(cfg.runtime.backend, world, cfg.runtime.device),
        inflight=b.inflight,
        max_seqs=b.max_seqs,
        cache_slots=b.cache_slots,
        max_len=b.max_len,
        longest_prompt=b.longest_prompt,
    )


class Batching(NamedTuple):
    """The run's requests and how they are grouped (see `Prepared`)."""

    requests: Sequence[Request]
    inflight: int
    max_seqs: int
    cache_slots: int
    max_len: int
    longest_prompt: int


def batching(cfg: EngineConfig, shape: ModelShape) -> Batching:
    """The requests (read or generated) and the micro-batches they make, whatever the split."""
    requests: Sequence[Request]
    work, pipe = cfg.workload, cfg.pipeline
    if work.prompts:
        requests = load_prompts(work.prompts, shape.vocab, work.max_new_tokens, max_len=shape.max_seq_len)
        longest_prompt = max(len(r.prompt_ids) for r in requests)
        max_len = max(len(r.prompt_ids) + r.max_new_tokens for r in requests)
    else:  # made one by one as the run takes them: nothing here may go through them all
        requests = generate_requests(work.requests, work.prompt_len, work.max_new_tokens, shape.vocab, work.seed)
        longest_prompt, max_len = work.prompt_len, work.prompt_len + work.max_new_tokens
        if max_len > shape.max_seq_len:  # (a prompts file names its line)
            raise InvalidConfigError(
                ErrorCode.SEQUENCE_TOO_LONG,
                f"each request needs {work.prompt_len} prompt + {work.max_new_tokens} new = {max_len} positions but "
                f"model {shape.name} holds {shape.max_seq_len}: lower --prompt-len or --max-new-tokens",
            )
    inflight = min(pipe.inflight, len(requests))
    if pipe.schedule == Schedule.SERVE:
        max_seqs = min(pipe.max_batch, len(requests))
        return Batching(requests, inflight, max_seqs, inflight * max_seqs, max_len, longest_prompt)
    per_mb = math.ceil(len(requests) / inflight)
    return Batching(requests, inflight, per_mb, len(requests), max_len, longest_prompt)


def host_available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is none: not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_memory(
    prep: Prepared, ranks: list[int], world: int, available: int | None, where: str, *, processes: bool
) -> None:
    """Refuse, in one line and before anything is built, a run whose `ranks` would not fit in `available`
    bytes (the host's memory for ranks on CPU, one GPU's free memory for a rank on it), rather than leave it
    to the kernel's out-of-memory killer or a CUDA error halfway through loading. `processes`: count what each
    rank's process takes besides the model too (host memory)."""
    if available is None:
        return
    weights = kv = 0
    for r in ranks:
        w, k = prep.rank_bytes(r, world)
        weights, kv = weights + w, kv + k
    need = weights + kv + (PROCESS_BYTES * len(ranks) if processes else 0)
    if need <= available:
        return
    m, schedule = prep.cfg.model, prep.cfg.pipeline.schedule
    who = f"{len(ranks)} ranks" if len(ranks) > 1 else f"rank {ranks[0]}"
    if m.synthetic:  # its layers allocate nothing: only the processes count
        raise InvalidConfigError(
            ErrorCode.NOT_ENOUGH_MEMORY,
            f"{len(ranks)} synthetic ranks need about {need / _GIB:.1f} GiB ({PROCESS_BYTES >> 20} MiB per process) "
            f"and {where} has {available / _GIB:.1f} GiB free: use fewer --stages",
        )
    if schedule == Schedule.SERVE:
        seqs = f"{prep.cache_slots} sequences = --max-inflight x --max-batch"
    else:  # every request of the batch keeps its cache until the batch is done
        seqs = f"{prep.cache_slots} sequences = every request of a {schedule} batch"
    raise InvalidConfigError(
        ErrorCode.NOT_ENOUGH_MEMORY,
        f"{prep.shape.name} in {m.dtype} needs about {need / _GIB:.1f} GiB for {who} ({weights / _GIB:.1f} GiB of "
        f"weights, {kv / _GIB:.1f} GiB of KV cache for {seqs}, {prep.max_len} positions each) and {where} has "
        f"{available / _GIB:.1f} GiB free: use a smaller --dtype, fewer sequences or positions, more --stages on "
        f"more devices, or size it without running it: ppscope plan --model "
        f"{m.name if m.name in PRESETS else 'DIR/config.json'}",
    )
