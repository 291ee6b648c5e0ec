"""The closed loop on a deliberately imbalanced synthetic pipeline: measured gain vs predicted gain.

Four stages of 5 ms layers with an LM head worth three layers: vLLM's default split leaves the last stage
the bottleneck. `ppscope.tune` profiles the layers, rebalances, re-runs; the reference is run 1 itself.
"""

from __future__ import annotations

import tempfile
from pathlib import Path


def main() -> list[str]:
    from engine.config import EngineConfig
    from ppscope.tune import tune

    cfg = EngineConfig(
        stages=4,
        schedule="serve",
        model="synthetic",
        layers=8,
        layer_cost_ms="5",
        head_cost_ms=15.0,
        requests=16,
        prompt_len=8,
        max_new_tokens=24,
        progress=False,
        nvtx=False,
    )
    with tempfile.TemporaryDirectory() as tmp:
        result = tune(cfg, out_dir=Path(tmp) / "tune", cost_source="profile")
    assert result.after is not None
    measured = result.measured_speedup or 0.0
    realised = result.realised or 0.0
    return [
        f"tune: split {','.join(map(str, result.before.split))} -> {','.join(map(str, result.after.split))} "
        f"(synthetic, 4 stages, 8 x 5 ms layers, 15 ms head, serve, 16 requests x 24 tokens)",
        f"tune: predicted speedup x{result.predicted_speedup:.3f}, measured x{measured:.3f} "
        f"(throughput of run 2 / run 1: {result.after.throughput_tokens_per_s:.1f} / "
        f"{result.before.throughput_tokens_per_s:.1f} tokens/s)",
        f"tune: measured gain / predicted gain = {realised:.2f} (target >= 0.90)",
    ]


if __name__ == "__main__":
    print("\n".join(main()))
