"""Figure builders: the Gantt with the analyzer's gaps, stage breakdown, theory vs measured."""

from __future__ import annotations

import numpy as np
import pytest

from ppscope.analysis import analyze
from ppscope.analysis.figures import stage_breakdown, theory_vs_measured
from ppscope.analysis.gantt import gantt_figure
from ppscope.trace.model import RunMeta, Trace


def _gpipe(p: int = 3, m: int = 4, t: int = 1000) -> Trace:
    rows = [
        dict(rank=s, stage=s, kind="forward", mb=mb, start_ns=(s + mb) * t, end_ns=(s + mb + 1) * t, nbytes=7)
        for s in range(p)
        for mb in range(m)
    ]
    rows += [dict(rank=s, stage=s, kind="recv_wait", start_ns=0, end_ns=s * t, peer=s - 1) for s in range(1, p)]
    return Trace.from_records(rows, meta=RunMeta(pp_size=p, schedule="gpipe", microbatches=m))


def test_gantt_shades_the_analyzers_gaps_under_the_bars() -> None:
    tr = _gpipe()
    res = analyze(tr)
    view = gantt_figure(tr.spans, gaps=res.gaps, stage_ranks={s.stage: s.ranks for s in res.stages})
    fig = view.figure
    assert fig.layout.xaxis.type == "linear" and not view.aggregated
    gap_traces = [d for d in fig.data if (d.meta or {}).get("role") == "gap"]
    assert gap_traces and fig.data[: len(gap_traces)] == tuple(gap_traces)  # shading is drawn first, under bars
    shaded_ms = sum(float(np.sum(d.x)) for d in gap_traces)
    assert shaded_ms == pytest.approx(sum(s.bubble_ns for s in res.stages) / 1e6)


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
    theory = next(d for d in th.data if d.x[0] == "theory")
    assert "GPipe" in theory.name and th.layout.xaxis.tickangle == 0  # no rotated label to cut
    assert "(" not in th.layout.title.text  # the title fits: the definition is the y axis's


def test_empty_trace_figures() -> None:
    res = analyze(Trace())
    assert len(gantt_figure(Trace().spans).figure.data) == 0
    assert len(theory_vs_measured(res).data) == 0
