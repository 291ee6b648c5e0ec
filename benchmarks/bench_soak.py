"""A soak of the real engine: `ppscope run` serving the synthetic model on 4 stages for about ten minutes
with recording on. It checks that the recorder's memory stays bounded (each rank's resident memory, sampled
by the engine every 100 ms, at the start of the serving and at its end) and that no span is lost (spans
counted as they were recorded, spans the flush thread wrote, rows in the rank file).

The length is SOAK_MINUTES (PPSCOPE_SOAK_MINUTES overrides it, e.g. 0.5 for a quick check): requests
arrive as a Poisson stream at a rate the pipeline sustains, so the run lasts about as long as the arrivals.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.record import Figure

SOAK_MINUTES = 10.0
STAGES = 4
LAYERS = 8  # 2 per stage
LAYER_MS = 2.0  # the synthetic model sleeps this long per layer: a stage takes ~4 ms
TOKENS = 50  # new tokens per request
RATE = 2.5  # requests per second: 125 tokens/s, about 70% of what 4 micro-batches in flight sustain here
BOUNDED = 1.10  # memory counts as bounded when a rank ends within 10% of its resident memory at the start


def _minutes() -> float:
    value = os.environ.get("PPSCOPE_SOAK_MINUTES", "")
    return float(value) if value else SOAK_MINUTES


def _serve(out: Path, requests: int, timeout_s: float) -> dict[str, object]:
    cmd = [
        *(sys.executable, "-m", "ppscope", "run", "--model", "synthetic", "--schedule", "serve"),
        *("--stages", str(STAGES), "--layers", str(LAYERS), "--layer-cost-ms", str(LAYER_MS)),
        *("--requests", str(requests), "--max-new-tokens", str(TOKENS), "--rate", str(RATE)),
        *("--out", str(out), "--no-progress", "--json"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ppscope run failed ({done.returncode}): {done.stderr[-2000:]}")
    summary: dict[str, object] = json.loads(done.stdout[done.stdout.index("{") :])
    return summary


def _rank_figures(run: Path) -> tuple[list[Figure], bool, bool]:
    """Per rank: memory at the start and end of serving, and the three span counts."""
    from ppscope.trace.model import Metric
    from ppscope.trace.store import load_run, read_rank_info

    trace = load_run(run)
    info = read_rank_info(run)
    spans, counters = trace.spans, trace.counters
    figures: list[Figure] = []
    bounded, complete = True, True
    for rank in sorted(info):
        mine = spans[spans["rank"] == rank]
        rows = len(mine)
        recorded, written = info[rank].get("spans_recorded"), info[rank].get("spans_written")
        same = recorded == written == rows
        complete &= same
        figures.append(
            Figure(
                f"soak rank {rank}: rows in the file (spans written {written:,})",
                rows,
                "",
                "spans recorded",
                recorded,
                target="= recorded = written",
                met=same,
            )
        )
        rss = counters[(counters["rank"] == rank) & (counters["metric"] == str(Metric.RSS_BYTES))]
        first_span = int(mine["start_ns"].min()) if rows else 0
        rss = rss[rss["ts_ns"].to_numpy() >= first_span]  # from the first span on: serving, not start-up
        if len(rss) < 2:
            figures.append(Figure(f"soak rank {rank}: resident memory", "no samples (GPU ranks sample NVML)"))
            continue
        ts, mem = rss["ts_ns"].to_numpy(), rss["value"].to_numpy() / 2**20
        start_mb, end_mb, peak_mb = float(mem[0]), float(mem[-1]), float(mem.max())
        half = len(mem) // 2  # the second half of the serving: past any warm-up, the slope a long run keeps
        starts = mine["start_ns"].to_numpy()
        late = int(np.count_nonzero((starts >= ts[half]) & (starts < ts[-1])))
        per_m = (end_mb - float(mem[half])) / (late / 1e6) if late else float("nan")
        bounded &= end_mb <= BOUNDED * start_mb
        figures += [
            Figure(
                f"soak rank {rank}: RSS at the end of serving (peak {peak_mb:.0f} MB)",
                end_mb,
                "MB",
                "its RSS at the start of serving",
                start_mb,
                target=f"<= {BOUNDED:.2f}x",
                met=end_mb <= BOUNDED * start_mb,
            ),
            Figure(
                f"soak rank {rank}: RSS growth in the second half of serving "
                f"({end_mb - float(mem[half]):+.1f} MB over {late:,} spans)",
                per_m,
                "MB per million spans",
            ),
        ]
    return figures, bounded, complete


def main() -> list[Figure]:
    minutes = _minutes()
    requests = max(4, round(minutes * 60 * RATE))
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        t0 = time.perf_counter()
        summary = _serve(run, requests, timeout_s=minutes * 60 * 3 + 600)
        wall_s = time.perf_counter() - t0
        per_rank, bounded, complete = _rank_figures(run)
    planned_s = requests / RATE
    return [
        Figure(
            f"soak: the run's length (synthetic model, serve, {STAGES} stages x {LAYERS // STAGES} layers x "
            f"{LAYER_MS:g} ms, recording on)",
            wall_s / 60,
            "min",
            f"the planned length, {requests:,} requests x {TOKENS} tokens arriving at {RATE}/s (Poisson)",
            planned_s / 60,
        ),
        Figure(
            "soak: tokens generated a second",
            float(str(summary.get("throughput_tokens_per_s", 0))),
            "tokens/s",
            "the arrivals' rate",
            RATE * TOKENS,
        ),
        *per_rank,
        Figure(
            f"soak: memory bounded (every rank ends within {BOUNDED:.2f}x its start)",
            "yes" if bounded else "no",
            target="yes",
            met=bounded,
        ),
        Figure(
            "soak: no span lost (recorded = written = rows, every rank)",
            "yes" if complete else "no",
            target="yes",
            met=complete,
        ),
    ]


if __name__ == "__main__":
    for figure in main():
        print(figure)
