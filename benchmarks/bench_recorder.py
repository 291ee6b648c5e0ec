"""Recorder cost per span, next to `nvtx.annotate` alone and `torch.profiler.record_function` under an
active profiler, all measured in this process, interleaved, best of several rounds.

With no NVTX tool attached (no nsys), NVTX calls go to the library's no-op domain: "NVTX on" then measures
the cost of issuing them, which is what a run pays when nobody profiles it.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.record import Figure

N = 100_000
ROUNDS = 5


def _per_span_ns(body: Callable[[int], None]) -> float:
    t0 = time.perf_counter_ns()
    body(N)
    return (time.perf_counter_ns() - t0) / N


def _cases(tmp: Path) -> dict[str, Callable[[int], None]]:
    import nvtx

    from ppscope.trace.model import RunMeta
    from ppscope.trace.recorder import Recorder
    from ppscope.trace.store import RankWriter, create_run

    mem_nvtx = Recorder(rank=0, stage=0, nvtx=True)
    mem_plain = Recorder(rank=0, stage=0, nvtx=False)
    off = Recorder(rank=0, stage=0, enabled=False)
    create_run(tmp / "run", RunMeta())
    stored = Recorder(RankWriter(tmp / "run", 0), rank=0, stage=0, nvtx=True)

    def loop(n: int) -> None:
        for _ in range(n):
            pass

    def annotate(n: int) -> None:
        for i in range(n):
            with nvtx.annotate("s0 forward", domain="ppscope", payload=i & 7):
                pass

    def recorder(rec: Recorder) -> Callable[[int], None]:
        def body(n: int) -> None:
            for i in range(n):
                with rec.span("forward", mb=i & 7, step=i, phase="decode"):
                    pass
            rec._kept.clear()

        return body

    cases = {
        "empty loop (reference floor)": loop,
        "nvtx.annotate alone": annotate,
        "Recorder, NVTX on, into SQLite": recorder(stored),
        "Recorder, NVTX on, in memory": recorder(mem_nvtx),
        "Recorder, NVTX off, in memory": recorder(mem_plain),
        "Recorder disabled": recorder(off),
    }
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile, record_function

        def rf(n: int) -> None:
            with profile(activities=[ProfilerActivity.CPU]):
                for _ in range(n):
                    with record_function("s0 forward"):
                        pass

        cases["torch record_function under active profiler"] = rf
        del torch
    except ImportError:
        pass
    return cases


def main() -> list[Figure]:
    with tempfile.TemporaryDirectory() as tmp:
        cases = _cases(Path(tmp))
        best = {name: float("inf") for name in cases}
        for _ in range(ROUNDS):
            for name, body in cases.items():
                best[name] = min(best[name], _per_span_ns(body))
    ours, annotate = "Recorder, NVTX on, into SQLite", "nvtx.annotate alone"
    references = dict.fromkeys(("empty loop (reference floor)", annotate), "")
    references["torch record_function under active profiler"] = ours
    figures = []
    for name, ns in best.items():
        ref = references.get(name, annotate)
        what = f"{name}, best of {ROUNDS} rounds of {N:,} spans"
        figures.append(Figure(what, ns, "ns/span", ref, best[ref]) if ref else Figure(what, ns, "ns/span"))
    return figures


if __name__ == "__main__":
    for figure in main():
        print(figure)
