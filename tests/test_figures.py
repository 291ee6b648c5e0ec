"""Figure builders: linear µs Gantt bars, aggregation above max_bars, stage breakdown, theory vs measured."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ppscope.analysis import analyze
from ppscope.errors import InvalidConfigError
from ppscope.figures import aggregate_bars, gantt, stage_breakdown, theory_vs_measured
from ppscope.trace import RunMeta, Trace, spans_frame


def _gpipe(p: int = 3, m: int = 4, t: int = 1000) -> Trace:
    rows = [
        dict(rank=s, stage=s, kind="forward", mb=mb, start_ns=(s + mb) * t, end_ns=(s + mb + 1) * t, nbytes=7)
        for s in range(p)
        for mb in range(m)
    ]
    rows += [dict(rank=s, stage=s, kind="recv_wait", start_ns=0, end_ns=s * t, peer=s - 1) for s in range(1, p)]
    return Trace.from_records(rows, meta=RunMeta(pp_size=p, schedule="gpipe", microbatches=m))


def test_gantt_bars_are_horizontal_on_linear_us_axis() -> None:
    tr = _gpipe()
    fig = gantt(tr, analyze(tr))
    bars = [d for d in fig.data if d.name == "forward"]
    assert len(bars) == 1 and bars[0].orientation == "h"
    assert fig.layout.xaxis.type == "linear"
    base = np.asarray(bars[0].base)
    assert sorted(base.tolist()) == sorted(float(s + mb) for s in range(3) for mb in range(4))  # µs
    assert np.all(np.asarray(bars[0].x) == 1.0)
    assert set(bars[0].y) == {"rank 0 · compute", "rank 1 · compute", "rank 2 · compute"}
    idle = {d.name for d in fig.data if d.name.startswith("idle")}
    assert idle == {"idle: fill", "idle: drain"}
    assert "stage" in bars[0].hovertemplate and "bytes" in bars[0].hovertemplate


def test_gantt_colour_by_mb_and_bad_option() -> None:
    tr = _gpipe()
    fig = gantt(tr, color_by="mb")
    names = [d.name for d in fig.data]
    assert "mb ≡ 2 (mod 9)" in names and len({d.marker.color for d in fig.data}) == len(names) == 5
    with pytest.raises(InvalidConfigError, match="color_by"):
        gantt(tr, color_by="lane")


def test_aggregation_keeps_under_max_bars_and_counts_spans() -> None:
    n = 100_000
    start = np.arange(n, dtype=np.int64) * 100
    df = spans_frame(
        dict(
            rank=np.arange(n) % 4,
            stage=np.arange(n) % 4,
            lane="compute",
            kind="forward",
            name="f",
            mb=0,
            step=0,
            chunk=0,
            phase="",
            start_ns=start,
            end_ns=start + 90,
            nbytes=0,
            tokens=0,
            peer=-1,
        )
    )
    fig = gantt(Trace(spans=df), max_bars=2000)
    total = sum(len(d.x) for d in fig.data)
    assert 0 < total <= 2000
    bars = df.assign(row=df["rank"].astype(str), key="forward")
    merged = aggregate_bars(bars, 2000, int(start[-1] + 90))
    assert len(merged) <= 2000 and int(merged["n"].sum()) == n


def test_aggregate_small_input_untouched() -> None:
    bars = pd.DataFrame(dict(row=["a", "a"], key=["k", "k"], start_ns=[0, 10], end_ns=[5, 20]))
    out = aggregate_bars(bars, 10, 20)
    assert list(out["n"]) == [1, 1] and len(out) == 2
    with pytest.raises(InvalidConfigError):
        aggregate_bars(bars, 0, 20)


def test_stage_breakdown_and_theory() -> None:
    tr = Trace.from_records(
        [
            dict(rank=0, stage=0, kind="forward", mb=0, start_ns=0, end_ns=10),
            dict(rank=1, stage=1, kind="forward", mb=0, start_ns=10, end_ns=40),
        ],
        meta=RunMeta(pp_size=2, schedule="gpipe", microbatches=1),
    )
    res = analyze(tr)
    fig = stage_breakdown(res)
    busy = next(d for d in fig.data if d.name == "busy")
    assert list(busy.y) == [10 / 1e6, 30 / 1e6] and list(busy.marker.line.width) == [0, 3]  # stage 1 outlined
    th = theory_vs_measured(res)
    measured = sum(d.y[0] for d in th.data if d.x[0] == "measured")
    assert measured == pytest.approx(100 * res.bubble_ratio)
    assert any("GPipe" in d.x[0] for d in th.data)


def test_empty_trace_figures() -> None:
    res = analyze(Trace())
    assert len(gantt(Trace(), res).data) == 0
    assert len(theory_vs_measured(res).data) == 0
