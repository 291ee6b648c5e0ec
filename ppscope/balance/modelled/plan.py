"""The capacity planner: memory per pipeline stage and the TP x PP layout for a model on a cluster.

Counts bytes from a `ModelShape` (weights per stage, KV cache per token per layer, the embedding on the
first stage and the LM head + logits on the last), says which stage runs out of memory and which split
fixes it (`ppscope.balance.advise.rebalance` with memory limits), and recommends a layout by the rules practitioners
use.
It measures nothing and knows no engine internals beyond the assumptions it prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ppscope.balance.advise.problem import BalanceProblem, MemoryModel
from ppscope.balance.advise.rebalance import balance, evaluate
from ppscope.balance.costs import LayerCosts, StageCosts
from ppscope.balance.modelled.gpus import GPU
from ppscope.balance.modelled.roofline import ModelCosts, Workload, model_costs
from ppscope.balance.modelled.shapes import ModelShape, dtype_bytes
from ppscope.balance.split import format_split, validate_split, vllm_default_split
from ppscope.errors import ErrorCode, InvalidConfigError
from ppscope.trace.actions import Phase
from ppscope.trace.notices import Notice, NoticeCode

__all__ = [
    "GIB",
    "CapacityPlan",
    "Cluster",
    "ParallelLayout",
    "PlanConfig",
    "StagePlan",
    "StepTimes",
    "plan",
    "stage_memory_model",
    "step_times",
]

GIB = 1 << 30
_LOGITS_BYTES = 4  # logits are kept in fp32 for sampling
_MAX_TP = 8  # tensor parallelism stays within a node's NVLink domain


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """The GPUs available."""

    gpus: int
    gpus_per_node: int = 8
    gpu_mem_gib: float = 80.0
    """Memory of one GPU, GiB: the capacity the driver reports, not the datasheet's GB."""
    gpu_mem_source: str = "given"
    """Where `gpu_mem_gib` comes from, for the assumptions."""
    gpu_memory_utilization: float = 0.9
    """Share of a GPU's memory the engine may use (vLLM's --gpu-memory-utilization)."""

    def __post_init__(self) -> None:
        if self.gpus < 1 or self.gpus_per_node < 1:
            raise InvalidConfigError(
                ErrorCode.BAD_VALUE, f"need at least 1 GPU and 1 GPU per node, got {self.gpus} and {self.gpus_per_node}"
            )
        if not self.gpu_mem_gib > 0:
            raise InvalidConfigError(ErrorCode.BAD_VALUE, f"--gpu-mem-gib must be > 0, got {self.gpu_mem_gib}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise InvalidConfigError(
                ErrorCode.BAD_VALUE, f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )

    @property
    def usable_bytes(self) -> int:
        return int(self.gpu_mem_gib * GIB * self.gpu_memory_utilization)


@dataclass(frozen=True, kw_only=True)
class PlanConfig:
    """What to plan for."""

    model: ModelShape
    cluster: Cluster
    dtype: str = "fp16"
    """Weights dtype."""
    kv_dtype: str = ""
    """KV cache dtype; empty: same as the weights."""
    max_model_len: int = 0
    """Longest sequence (prompt + output); 0: the model's own maximum."""
    max_num_seqs: int = 256
    """Sequences batched at once: sizes the last stage's logits buffer (vLLM's default)."""
    reserve_gib: float = 1.0
    """Per GPU: activations, workspace, CUDA graphs and the runtime, which are neither weights nor KV cache."""
    min_sequences: int = 4
    """A layout fits when every stage holds the KV cache of this many max-length sequences (a useful batch)."""
    latency_sensitive: bool = False
    tp: int = 0
    """Tensor-parallel size to evaluate; 0: recommend one."""
    pp: int = 0
    """Pipeline-parallel size to evaluate; 0: recommend one."""
    split: tuple[int, ...] = ()
    """Layer counts per stage to evaluate; empty: vLLM's default rule."""

    def __post_init__(self) -> None:
        dtype_bytes(self.dtype)
        dtype_bytes(self.kv_dtype or self.dtype)
        if self.max_model_len < 0 or self.max_num_seqs < 1 or self.reserve_gib < 0 or self.min_sequences < 0:
            raise InvalidConfigError(
                ErrorCode.BAD_VALUE,
                "--max-model-len, --max-num-seqs, --reserve-gib and --min-sequences must be >= 0 (max-num-seqs >= 1)",
            )
        if self.tp < 0 or self.pp < 0:
            raise InvalidConfigError(ErrorCode.BAD_VALUE, f"--tp and --pp must be >= 1, got tp={self.tp} pp={self.pp}")

    @property
    def seq_len(self) -> int:
        return self.max_model_len or self.model.max_seq_len


@dataclass(frozen=True, kw_only=True)
class StagePlan:
    """Memory of one pipeline stage, per GPU of its tensor-parallel group."""

    stage: int
    layers: int
    weights_bytes: int
    """Decoder layers plus the stage's extra weights."""
    extra_bytes: int
    """First stage: embedding. Last stage: final norm, LM head and the fp32 logits buffer."""
    kv_bytes: int
    """What is left for KV cache (negative: the stage does not fit)."""
    kv_tokens: int
    kv_sequences: int
    """Max-length sequences whose KV cache the stage holds."""

    @property
    def layer_weights_bytes(self) -> int:
        """The decoder layers' weights alone: `weights_bytes` less `extra_bytes`."""
        return self.weights_bytes - self.extra_bytes

    @property
    def fits(self) -> bool:
        return self.kv_bytes >= 0


@dataclass(frozen=True, kw_only=True)
class ParallelLayout:
    tp: int
    pp: int
    replicas: int
    """Independent copies of the pipeline the cluster holds (data parallel)."""
    reason: str


@dataclass(frozen=True, kw_only=True)
class CapacityPlan:
    config: PlanConfig
    layout: ParallelLayout
    split: tuple[int, ...]
    stages: tuple[StagePlan, ...]
    kv_bytes_per_token_per_layer: int
    """Whole model, before tensor parallelism."""
    kv_bytes_per_token_per_layer_per_gpu: int
    fix_split: tuple[int, ...] | None
    """The split that maximises KV capacity, when it differs from `split` and helps."""
    fix_stages: tuple[StagePlan, ...] | None
    warnings: tuple[Notice, ...]
    assumptions: tuple[str, ...]

    @property
    def pipeline_kv_tokens(self) -> int:
        return max(0, min(s.kv_tokens for s in self.stages))

    @property
    def pipeline_kv_sequences(self) -> int:
        return max(0, min(s.kv_sequences for s in self.stages))

    @property
    def fits(self) -> bool:
        return all(s.fits for s in self.stages)

    @property
    def kv_verdict(self) -> str:
        """`out of memory`, `almost none` (some stage is tight, see `warnings`) or `ample`."""
        if not self.fits:
            return "out of memory"
        return "almost none" if any(w.code == NoticeCode.LITTLE_KV_ROOM for w in self.warnings) else "ample"

    def to_dict(self) -> dict[str, Any]:
        cfg = self.config

        def stages(rows: tuple[StagePlan, ...]) -> list[dict[str, Any]]:
            return [{**r.__dict__, "layer_weights_bytes": r.layer_weights_bytes, "fits": r.fits} for r in rows]

        return {
            "model": cfg.model.name,
            "dtype": cfg.dtype,
            "kv_dtype": cfg.kv_dtype or cfg.dtype,
            "max_model_len": cfg.seq_len,
            "gpus": cfg.cluster.gpus,
            "usable_bytes_per_gpu": cfg.cluster.usable_bytes,
            "reserve_bytes_per_gpu": int(cfg.reserve_gib * GIB),
            "tp": self.layout.tp,
            "pp_size": self.layout.pp,
            "replicas": self.layout.replicas,
            "reason": self.layout.reason,
            "split": list(self.split),
            "kv_bytes_per_token_per_layer": self.kv_bytes_per_token_per_layer,
            "kv_bytes_per_token_per_layer_per_gpu": self.kv_bytes_per_token_per_layer_per_gpu,
            "stages": stages(self.stages),
            "first_stage_extra_bytes": self.stages[0].extra_bytes,
            "last_stage_extra_bytes": self.stages[-1].extra_bytes,
            "pipeline_kv_tokens": self.pipeline_kv_tokens,
            "pipeline_kv_sequences": self.pipeline_kv_sequences,
            "fits": self.fits,
            "kv_verdict": self.kv_verdict,
            "fix_split": None if self.fix_split is None else list(self.fix_split),
            "fix_vllm_env": None
            if self.fix_split is None
            else f"VLLM_PP_LAYER_PARTITION={format_split(self.fix_split)}",
            "fix_stages": None if self.fix_stages is None else stages(self.fix_stages),
            "warnings": [w.to_json() for w in self.warnings],
            "assumptions": list(self.assumptions),
        }


@dataclass(frozen=True, kw_only=True)
class StepTimes:
    """The modelled decode step of each stage of a plan's split, and of its fix, on one GPU (`ppscope plan
    --gpu`)."""

    costs: ModelCosts
    stage_ms: tuple[float, ...]
    fix_stage_ms: tuple[float, ...] | None

    def to_json(self) -> dict[str, Any]:
        w = self.costs.workload
        return {
            "gpu": self.costs.gpu.name,
            "phase": str(w.phase),
            "batch": w.batch,
            "context": w.context,
            "stage_ms": list(self.stage_ms),
            "fix_stage_ms": None if self.fix_stage_ms is None else list(self.fix_stage_ms),
            "assumptions": self.costs.assumptions(),
        }


def step_times(capacity: CapacityPlan, gpu: GPU, *, batch: int, context: int) -> StepTimes:
    """Each stage's modelled decode step under the plan's split and its fix, `batch` sequences of `context`
    tokens each, on `gpu`."""
    cfg = capacity.config
    work = Workload(phase=Phase.DECODE, batch=batch, context=context, dtype=cfg.dtype, tp=capacity.layout.tp)
    modelled = model_costs(cfg.model, gpu, work)
    problem = BalanceProblem(costs=modelled.layer_costs(), stages=capacity.layout.pp, stage_costs=StageCosts())
    fix = capacity.fix_split
    return StepTimes(
        costs=modelled,
        stage_ms=evaluate(problem, capacity.split).stage_ms,
        fix_stage_ms=None if fix is None else evaluate(problem, fix).stage_ms,
    )


@dataclass(frozen=True, kw_only=True)
class _Bytes:
    """Per-GPU byte counts of one layout."""

    layer: int
    embed: int
    head: int
    kv_per_token_layer: int
    reserve: int
    usable: int

    def memory_model(self, limits: tuple[int, ...], min_tokens: int = 0) -> MemoryModel:
        """What each stage must hold, within `limits` (bytes per stage)."""
        return MemoryModel(
            limit_bytes=limits,
            layer_bytes=self.layer,
            kv_bytes_per_token_per_layer=self.kv_per_token_layer,
            embed_bytes=self.embed,
            head_bytes=self.head,
            reserve_bytes=self.reserve,
            min_kv_tokens=min_tokens,
        )


def _bytes(cfg: PlanConfig, tp: int, pp: int) -> _Bytes:
    m, wb = cfg.model, dtype_bytes(cfg.dtype)
    head = m.head_params
    if m.tie_embeddings and pp == 1:
        head -= m.vocab * m.hidden  # one copy serves both ends
    return _Bytes(
        layer=-(-m.layer_params * wb // tp),
        embed=-(-m.embed_params * wb // tp),
        head=-(-head * wb // tp) + cfg.max_num_seqs * -(-m.vocab // tp) * _LOGITS_BYTES,
        kv_per_token_layer=m.kv_bytes_per_token_per_layer_per_gpu(cfg.kv_dtype or cfg.dtype, tp),
        reserve=int(cfg.reserve_gib * GIB),
        usable=cfg.cluster.usable_bytes,
    )


def stage_memory_model(
    model: ModelShape,
    gpu_mem_gib: list[float],
    *,
    gpu_memory_utilization: float = 0.9,
    dtype: str = "fp16",
    kv_dtype: str = "",
    tp: int = 1,
    reserve_gib: float = 1.0,
    max_num_seqs: int = 256,
    min_kv_tokens: int = 0,
) -> MemoryModel:
    """The rebalancer's memory model of a pipeline with one GPU memory size per stage (heterogeneous GPUs)."""
    if not gpu_mem_gib:
        raise InvalidConfigError(
            ErrorCode.MISSING_OPTION, "give the memory of the stages' GPUs (--gpu-mem-gib), one value or one per stage"
        )
    clusters = [Cluster(gpus=1, gpu_mem_gib=g, gpu_memory_utilization=gpu_memory_utilization) for g in gpu_mem_gib]
    cfg = PlanConfig(
        model=model,
        cluster=clusters[0],
        dtype=dtype,
        kv_dtype=kv_dtype,
        reserve_gib=reserve_gib,
        max_num_seqs=max_num_seqs,
    )
    b = _bytes(cfg, tp, len(gpu_mem_gib))
    return b.memory_model(tuple(c.usable_bytes for c in clusters), min_kv_tokens)


def _stages(cfg: PlanConfig, b: _Bytes, split: tuple[int, ...]) -> tuple[StagePlan, ...]:
    pp, out = len(split), []
    for s, n in enumerate(split):
        extra = (b.embed if s == 0 else 0) + (b.head if s == pp - 1 else 0)
        weights = n * b.layer + extra
        kv = b.usable - b.reserve - weights
        tokens = kv // (n * b.kv_per_token_layer) if kv >= 0 else -1
        out.append(
            StagePlan(
                stage=s,
                layers=n,
                weights_bytes=weights,
                extra_bytes=extra,
                kv_bytes=kv,
                kv_tokens=tokens,
                kv_sequences=tokens // cfg.seq_len if tokens >= 0 else -1,
            )
        )
    return tuple(out)


def _best_split(cfg: PlanConfig, b: _Bytes, pp: int) -> tuple[int, ...] | None:
    """The split with the most KV capacity (ties: the most even compute), or None when nothing fits."""
    problem = BalanceProblem(
        costs=LayerCosts.uniform(cfg.model.layers, 1.0),
        stages=pp,
        memory=b.memory_model((b.usable,) * pp),
        objective="memory",
    )
    try:
        return tuple(balance(problem))
    except InvalidConfigError:
        return None


def _fits(cfg: PlanConfig, tp: int, pp: int) -> bool:
    """Some split of this layout holds min_sequences max-length sequences on every stage."""
    if pp > cfg.model.layers:
        return False
    best = _best_split(cfg, _bytes(cfg, tp, pp), pp)
    return best is not None and min(s.kv_sequences for s in _stages(cfg, _bytes(cfg, tp, pp), best)) >= max(
        cfg.min_sequences, 0
    )


def _tp_options(cfg: PlanConfig, limit: int) -> list[int]:
    heads = cfg.model.heads
    return [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= min(limit, _MAX_TP) and heads % t == 0]


def _recommend(cfg: PlanConfig) -> ParallelLayout:
    c = cfg.cluster
    node = min(c.gpus_per_node, c.gpus)
    tps = _tp_options(cfg, node)

    def layout(tp: int, pp: int, reason: str) -> ParallelLayout:
        return ParallelLayout(tp=tp, pp=pp, replicas=c.gpus // (tp * pp), reason=reason)

    if cfg.latency_sensitive:
        tp = tps[-1]
        for pp in range(1, c.gpus // tp + 1):
            if _fits(cfg, tp, pp):
                why = "latency-sensitive: the widest TP within a node and the smallest PP that fits"
                return layout(tp, pp, why)
    elif _fits(cfg, 1, 1):
        return layout(1, 1, "the model fits on one GPU: no parallelism, one replica per GPU")
    else:
        for tp in tps:
            if _fits(cfg, tp, 1):
                return layout(tp, 1, f"the model fits in one node: TP={tp}, the smallest that fits, no PP")
        tp = tps[-1]
        for pp in range(2, c.gpus // tp + 1):
            if _fits(cfg, tp, pp):
                return layout(tp, pp, f"the model needs more than a node: TP = GPUs per node ({tp}) x PP = {pp}")
    raise InvalidConfigError(
        ErrorCode.NOT_ENOUGH_MEMORY,
        f"{cfg.model.name} in {cfg.dtype} does not fit on {c.gpus} GPU(s) of {c.gpu_mem_gib:g} GiB at "
        f"{c.gpu_memory_utilization:g} utilisation with {cfg.min_sequences} sequence(s) of {cfg.seq_len} tokens: "
        "add GPUs, use a smaller dtype (--dtype fp8) or a shorter --max-model-len",
    )


def plan(cfg: PlanConfig) -> CapacityPlan:
    """Memory per stage for the given (or recommended) TP x PP layout, and the split that fixes a stage that
    runs out of memory."""
    c = cfg.cluster
    if cfg.tp or cfg.pp or cfg.split:
        tp, pp = cfg.tp or 1, cfg.pp or (len(cfg.split) if cfg.split else 1)
        if tp * pp > c.gpus:
            raise InvalidConfigError(
                ErrorCode.WORLD_SIZE_MISMATCH, f"TP {tp} x PP {pp} needs {tp * pp} GPUs but --gpus is {c.gpus}"
            )
        if pp > cfg.model.layers:
            raise InvalidConfigError(ErrorCode.TOO_FEW_LAYERS, f"PP {pp} exceeds the model's {cfg.model.layers} layers")
        if cfg.model.heads % tp:
            valid = ", ".join(str(t) for t in range(1, cfg.model.heads + 1) if cfg.model.heads % t == 0 and t <= 64)
            raise InvalidConfigError(
                ErrorCode.HEADS_NOT_DIVISIBLE,
                f"TP {tp} does not divide the model's {cfg.model.heads} attention heads; valid: {valid}",
            )
        layout = ParallelLayout(tp=tp, pp=pp, replicas=c.gpus // (tp * pp), reason="as given")
    else:
        layout = _recommend(cfg)
    b = _bytes(cfg, layout.tp, layout.pp)
    split = cfg.split or tuple(vllm_default_split(cfg.model.layers, layout.pp))
    validate_split(split, cfg.model.layers, layout.pp)
    stages = _stages(cfg, b, split)
    warnings = _warnings(cfg, stages)
    fix = _best_split(cfg, b, layout.pp)
    fix_stages = None
    if fix is not None and fix != split:
        fix_stages = _stages(cfg, b, fix)
        if min(s.kv_tokens for s in fix_stages) <= min(s.kv_tokens for s in stages):
            fix, fix_stages = None, None
    elif fix == split:
        fix = None
    if fix is None and not all(s.fits for s in stages):
        text = f"no split of {cfg.model.layers} layers over {layout.pp} stages fits: use more GPUs"
        warnings.append(Notice(NoticeCode.NO_SPLIT_FITS, text))
    return CapacityPlan(
        config=cfg,
        layout=layout,
        split=tuple(split),
        stages=stages,
        kv_bytes_per_token_per_layer=cfg.model.kv_bytes_per_token_per_layer(cfg.kv_dtype or cfg.dtype),
        kv_bytes_per_token_per_layer_per_gpu=b.kv_per_token_layer,
        fix_split=fix,
        fix_stages=fix_stages,
        warnings=tuple(warnings),
        assumptions=_assumptions(cfg, layout),
    )


def _warnings(cfg: PlanConfig, stages: tuple[StagePlan, ...]) -> list[Notice]:
    out = []
    for s in stages:
        if not s.fits:
            text = (
                f"stage {s.stage} runs out of memory: its weights ({s.weights_bytes / GIB:.1f} GiB) plus reserve "
                f"exceed the {cfg.cluster.usable_bytes / GIB:.1f} GiB usable by {-s.kv_bytes / GIB:.2f} GiB"
            )
            out.append(Notice(NoticeCode.OUT_OF_MEMORY, text))
        elif s.kv_sequences < max(cfg.min_sequences, 1) or s.kv_bytes < 0.1 * cfg.cluster.usable_bytes:
            text = (
                f"stage {s.stage} has almost no room for KV cache: {s.kv_bytes / GIB:.2f} GiB = {s.kv_tokens} tokens "
                f"= {s.kv_sequences} sequence(s) of {cfg.seq_len} tokens"
            )
            out.append(Notice(NoticeCode.LITTLE_KV_ROOM, text))
    return out


def _assumptions(cfg: PlanConfig, layout: ParallelLayout) -> tuple[str, ...]:
    c = cfg.cluster
    return (
        f"usable memory per GPU = {c.gpu_mem_gib:.2f} GiB ({c.gpu_mem_source}) x {c.gpu_memory_utilization:g} "
        f"= {c.usable_bytes / GIB:.2f} GiB",
        f"weights in {cfg.dtype} ({dtype_bytes(cfg.dtype)} B/param), KV cache in {cfg.kv_dtype or cfg.dtype}",
        f"tensor parallelism divides every weight and the KV heads by TP={layout.tp} "
        "(KV heads are replicated when TP exceeds them)",
        "the first stage holds the embedding; the last holds the final norm, the LM head"
        + (" (a second copy of the tied embedding)" if cfg.model.tie_embeddings and layout.pp > 1 else "")
        + f" and an fp32 logits buffer for {cfg.max_num_seqs} sequences",
        f"{cfg.reserve_gib:g} GiB per GPU reserved for activations, workspace and runtime (--reserve-gib)",
        f"a layout fits when every stage holds {cfg.min_sequences} sequence(s) of {cfg.seq_len} tokens",
        "no pipeline KV cache is shared: the pipeline's capacity is the smallest stage's",
        *_shape_notes(cfg.model),
    )


def _shape_notes(m: ModelShape) -> tuple[str, ...]:
    """What the plan assumes about shapes beyond Llama's: layers of different sizes (DeepSeek-V3's dense ones
    before its MoE ones) are planned at the largest's; a latent KV cache is whole on every GPU."""
    notes: tuple[str, ...] = ()
    if m.layer_params_at(0) != m.layer_params:
        notes += (
            f"every layer is counted at the largest one's size ({m.layer_params / 1e9:.2f}B parameters; the first "
            f"layers hold {m.layer_params_at(0) / 1e9:.2f}B), which overstates the first stage's weights",
        )
    if m.mla is not None:
        notes += ("latent attention: each token's cached latent is whole on every GPU of a TP group (as in vLLM)",)
    return notes
