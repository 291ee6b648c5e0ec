"""The report's gap to theory adds up, figures not measured read "–" with the reason, and a trace that only
holds collectives says it does not look like a pipeline."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ppscope.analysis import AnalysisResult, analyze
from ppscope.analysis.report import NOT_MEASURED, gap_sentence, hop_table, render_text
from ppscope.balance.costs import LayerCosts
from ppscope.simulate.simulator import CommModel, SimConfig, simulate
from ppscope.trace.model import RunMeta, Trace
from ppscope.trace.notices import NoticeCode

ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
NOISY = dict(overhead_ms=0.3, comm=CommModel(latency_us=400, bandwidth_gb_per_s=1, activation_bytes=200_000))


def _sim(**kw: Any) -> AnalysisResult:
    virtual = kw["stages"] * kw.get("chunks", 1)
    return analyze(simulate(SimConfig(costs=LayerCosts.uniform(2 * virtual, 1.0), **kw)))


def _printed_parts(sentence: str) -> tuple[float, list[float]]:
    total, rest = re.match(r"gap to theory: ([+-]\d+\.\d) points = (.*)$", sentence).groups()  # type: ignore[union-attr]
    rest = re.sub(r" \(measured [^)]*\)", "", rest)
    return float(total), [float(part.rsplit(" ", 1)[1]) for part in rest.split(" + ")]


@pytest.mark.parametrize(
    "kw",
    [
        dict(schedule="gpipe", stages=4, microbatches=8, steps=3),
        dict(schedule="gpipe", stages=4, microbatches=8, steps=3, speed=(1.0, 1.0, 0.7, 1.0), **NOISY),
        dict(schedule="interleaved", stages=3, microbatches=6, chunks=2, steps=2, **NOISY),
        dict(schedule="serve", stages=4, microbatches=2, steps=6, speed=(1.0, 0.8, 1.0, 1.0), **NOISY),
        dict(schedule="serve", stages=4, microbatches=6, steps=6, **NOISY),
    ],
    ids=["gpipe", "gpipe-uneven", "interleaved-noisy", "serve-2-of-4", "serve-6-of-4"],
)
def test_gap_parts_add_up_in_the_result_and_as_printed(kw: dict[str, Any]) -> None:
    res = _sim(**kw)
    gap = res.theory_gap
    assert gap is not None and res.bubble_ratio is not None and res.theory.bubble_ratio is not None
    assert gap.ratio == pytest.approx(res.bubble_ratio - res.theory.bubble_ratio, abs=1e-12)
    assert sum(gap.parts.values()) == pytest.approx(gap.ratio, abs=1e-12)
    first = next(iter(gap.parts))
    assert first == "+".join(res.theory.causes)
    total, parts = _printed_parts(gap_sentence(res))
    assert total == pytest.approx(round(100 * gap.ratio, 1), abs=0.051)
    assert sum(parts) == pytest.approx(total, abs=1e-9)  # the printed parts add up to the printed gap
    assert len(parts) == len(gap.parts)
    assert gap_sentence(res) in render_text(res, width=400)
    out = res.to_json()["theory_gap"]
    assert out["ratio"] == gap.ratio and out["parts"] == gap.parts


def test_the_formulas_own_causes_can_fall_short_of_it() -> None:
    # two of four in flight over a few steps: the ring's dependency is below the steady-state bound (the fill
    # and drain of the run stand in for part of it), so its part is negative and the others make up the rest
    res = _sim(schedule="serve", stages=4, microbatches=2, steps=5)
    assert res.theory_gap is not None and res.theory_gap.parts["dependency"] < 0
    sentence = gap_sentence(res)
    assert sentence.startswith("gap to theory: +2.4 points = dependency -11.9 (measured 38.1 against the formula")
    assert sentence.endswith("+ fill +7.2 + drain +7.1")  # 7.14 and 7.14: one takes the tenth the sum needs


def test_no_gap_without_a_formula_or_with_a_stage_missing() -> None:
    res = _sim(schedule="gpipe", stages=2, microbatches=2)
    assert res.theory_gap is not None
    rows = [dict(rank=0, kind="forward", start_ns=0, end_ns=10)]
    assert analyze(Trace.from_records(rows)).theory_gap is None  # no schedule, no formula
    missing = Trace.from_records(rows, meta=RunMeta(schedule="gpipe", world_size=2, pp_size=2, microbatches=2))
    assert analyze(missing).theory_gap is None and "gap to theory:" not in render_text(analyze(missing))


def test_a_transfer_inside_the_receive_wait_reads_not_measured_with_the_reason() -> None:
    # the engine over gloo: the payload rides in its header, so a hop has sends and waits but no `recv` span
    rows = []
    for i in range(3):
        t = 100 * i
        rows += [
            dict(rank=0, stage=0, kind="forward", start_ns=t, end_ns=t + 40, mb=0, step=i),
            dict(rank=0, stage=0, kind="send", start_ns=t + 40, end_ns=t + 45, mb=0, step=i, peer=1, nbytes=4096),
            dict(rank=1, stage=1, kind="recv_wait", start_ns=t, end_ns=t + 50, mb=0, step=i, peer=0, nbytes=4096),
            dict(rank=1, stage=1, kind="forward", start_ns=t + 50, end_ns=t + 90, mb=0, step=i),
        ]
    res = analyze(Trace.from_records(rows))
    (hop,) = res.hops
    assert hop.recv_ns is None and hop.bandwidth_gb_per_s is None and hop.latency_ns == 10
    assert res.to_json()["hops"][0]["recv_ns"] is None
    text = render_text(res, width=200)
    row = next(line for line in text.splitlines() if "0→1" in line and "│" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[4] == NOT_MEASURED and cells[6] == NOT_MEASURED != cells[7]  # transfer ms, GB/s
    assert "0.000" not in cells[4] and cells[6] != "0.00"
    caption = str(hop_table(res).caption)
    assert caption.startswith(f"{NOT_MEASURED} transfer ms, GB/s on 0→1: not measured, no `recv` span: the transfer")
    assert "inside the receive wait" in caption and "latency" not in caption  # the latency was measured
    assert caption.splitlines()[0].split()[-1] in text  # printed under the table


def test_collectives_without_point_to_point_traffic_are_not_a_pipeline() -> None:
    rows = []
    for r in range(2):
        rows += [
            dict(rank=r, kind="kernel", name="sm90_gemm", lane="stream 7", start_ns=0, end_ns=50),
            dict(rank=r, kind="nccl", name=ALL_REDUCE, lane="stream 9", start_ns=50, end_ns=80),
            dict(rank=r, kind="range", name="nccl:all_gather", lane="host", start_ns=80, end_ns=90),
            dict(rank=r, kind="kernel", name="sm90_gemm", lane="stream 7", start_ns=100, end_ns=150),
        ]
    res = analyze(Trace.from_records(rows, meta=RunMeta(source="kineto", world_size=2)))
    (warning,) = [w for w in res.warnings if w.code == NoticeCode.COLLECTIVES_ONLY]
    assert "all-reduce, all-gather" in warning.text  # the collectives, named
    assert all(s.causes["comm"] == 40 for s in res.stages)  # the all-reduce kernel and the all-gather range
    rows.append(dict(rank=0, kind="nccl", name="ncclDevKernel_SendRecv", lane="stream 9", start_ns=90, end_ns=95))
    res = analyze(Trace.from_records(rows, meta=RunMeta(source="kineto", world_size=2)))
    assert NoticeCode.COLLECTIVES_ONLY not in {w.code for w in res.warnings}
