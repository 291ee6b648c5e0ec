"""The unsplit model run request by request, without any pipeline: the answer the pipeline must give.

Used by tests and benchmarks to check that every schedule and split generates the same tokens.
"""

from __future__ import annotations

import torch

from ppscope.engine.config import EngineConfig
from ppscope.engine.model import Batch
from ppscope.engine.prepare import make_source, prepare, torch_dtype
from ppscope.engine.sampling import Sampling, row_keys, sample
from ppscope.engine.stage import build_stage

__all__ = ["reference_outputs"]


@torch.no_grad()
def reference_outputs(cfg: EngineConfig) -> list[list[int]]:
    """Output ids of every request of `cfg`, one request at a time through the whole model: greedy, or
    sampled as `cfg` says (a draw is keyed by seed, request and position, so a pipeline draws the same)."""
    prep = prepare(cfg, cfg.pipeline.stages)
    shape, dtype, device = prep.shape, torch_dtype(cfg.model.dtype), torch.device("cpu")
    module = build_stage(make_source(cfg, shape), [shape.layers], 0, 1, 1, device, dtype)
    module.allocate_cache(1, prep.max_len, dtype, shape.kv_heads, shape.head_dim)
    work = cfg.workload
    sampling = Sampling(temperature=work.temperature, top_p=work.top_p, seed=work.seed)
    outputs = []
    for req in prep.requests:
        ids = torch.tensor(req.prompt_ids)
        batch = Batch([0], [0], [len(req.prompt_ids)])
        out: list[int] = []
        while len(out) < req.max_new_tokens:
            x = module.run_embed(ids, shape.hidden, dtype)
            x = module.run_chunk(0, x, batch)
            keys = row_keys(work.seed, [req.id], [len(req.prompt_ids) + len(out)]) if work.temperature > 0 else None
            token = int(sample(module.run_head(x, batch, shape.vocab), sampling, keys).item())
            out.append(token)
            ids = torch.tensor([token])
            batch = Batch([0], [len(req.prompt_ids) + len(out) - 1], [1])
        outputs.append(out)
    return outputs
