"""The dashboard's figure builders on traces with known spans: exactly those bars, or an honest aggregate."""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt
import pandas as pd
import pytest

from ppscope.analysis import analyze
from ppscope.analysis.figures import CAUSE_COLORS as FIGURE_COLORS
from ppscope.analysis.gantt import AGGREGATE_BINS, CAUSE_COLORS, CAUSE_DELTA_E, gantt_figure, row_labels
from ppscope.analysis.result import CAUSES
from ppscope.dashboard.charts import compare_table, job_compare_table, spread_compare_table, usage_figure
from ppscope.trace.model import Metric, RunMeta, Trace, counters_frame, spans_frame

SPANS = [
    # rank, lane, kind, mb, start_ns, end_ns
    (0, "compute", "forward", 0, 1_000, 1_500),
    (0, "compute", "forward", 1, 1_600, 2_350),
    (0, "send", "send", 0, 1_500, 1_620),
    (1, "recv", "recv_wait", 0, 1_000, 1_620),
    (1, "compute", "forward", 0, 1_620, 2_000),
    (1, "host", "mark", -1, 1_700, 1_700),  # zero-length: not drawn
]


def _trace(rows: list[tuple[int, str, str, int, int, int]] = SPANS) -> Trace:
    return Trace.from_records(
        [
            {"rank": r, "stage": r, "lane": lane, "kind": kind, "mb": mb, "start_ns": s, "end_ns": e, "nbytes": 64}
            for r, lane, kind, mb, s, e in rows
        ],
        meta=RunMeta(world_size=2, pp_size=2, schedule="gpipe", microbatches=2),
    )


def _bars(fig: object, role: str = "spans") -> list[tuple[str, float, float]]:
    """(row, start, width) of each bar in µs: the axis is in ms, the spans here last fractions of a µs."""
    out = []
    for t in fig.data:  # type: ignore[attr-defined]
        if (t.meta or {}).get("role") == role:
            base, width = (np.round(np.asarray(v, float) * 1e3, 6) for v in (t.base, t.x))
            out += list(zip(t.y, base, width, strict=True))
    return sorted(out, key=lambda b: (b[1], b[0]))


def test_every_span_is_one_bar_with_its_start_width_and_row() -> None:
    view = gantt_figure(_trace().spans)
    assert not view.aggregated and view.bars == 5 and view.spans_in_window == 5
    # x is ms since the first span; widths are durations, to the nanosecond (here in µs)
    assert _bars(view.figure) == [
        ("rank 0 · compute", 0.0, 0.5),
        ("rank 1 · recv", 0.0, 0.62),
        ("rank 0 · send", 0.5, 0.12),
        ("rank 0 · compute", 0.6, 0.75),
        ("rank 1 · compute", 0.62, 0.38),
    ]
    for trace in view.figure.data:
        assert trace.orientation == "h" and trace.type == "bar"
    assert view.figure.layout.xaxis.type == "linear"
    assert list(view.figure.layout.yaxis.categoryarray) == [
        "rank 0 · compute",
        "rank 0 · send",
        "rank 1 · compute",
        "rank 1 · recv",
    ]  # no row for the mark alone


def test_colour_modes_group_bars_by_micro_batch_or_kind() -> None:
    by_mb = gantt_figure(_trace().spans, color_by="micro-batch").figure
    assert sorted((t.name, len(t.base)) for t in by_mb.data) == [("mb 0", 4), ("mb 1", 1)]
    by_kind = gantt_figure(_trace().spans, color_by="kind").figure
    assert sorted((t.name, len(t.base)) for t in by_kind.data) == [("forward", 3), ("recv_wait", 1), ("send", 1)]
    with pytest.raises(ValueError, match="micro-batch, kind"):  # the valid ones
        gantt_figure(_trace().spans, color_by="colour")


def test_hover_carries_stage_micro_batch_step_phase_duration_and_bytes() -> None:
    fig = gantt_figure(_trace().spans, color_by="kind").figure
    send = next(t for t in fig.data if t.name == "send")
    name, stage, mb, step, phase, dur_ms, nbytes = send.customdata[0]
    assert (name, stage, mb, step, phase, nbytes) == ("send", 0, 0, -1, "", "64")
    assert dur_ms == pytest.approx(0.12e-3)
    for field in ("stage", "mb", "step", "duration", "bytes"):
        assert field in send.hovertemplate


def test_window_keeps_only_overlapping_spans_on_the_same_axis() -> None:
    view = gantt_figure(_trace().spans, window_ns=(1_560, 1_610), origin_ns=1_000)
    assert {row for row, _, _ in _bars(view.figure)} == {"rank 0 · send", "rank 0 · compute", "rank 1 · recv"}
    assert view.spans_in_window == 3
    assert list(view.figure.layout.xaxis.range) == pytest.approx([0.56e-3, 0.61e-3])


def test_gaps_are_shaded_on_the_compute_rows_of_their_stage() -> None:
    trace = _trace()
    result = analyze(trace)
    stage_ranks = {s.stage: s.ranks for s in result.stages}
    view = gantt_figure(trace.spans, gaps=result.gaps, stage_ranks=stage_ranks)
    gaps = _bars(view.figure, role="gap")
    assert len(gaps) == len(result.gaps)
    assert {row for row, _, _ in gaps} <= {"rank 0 · compute", "rank 1 · compute"}
    # the shading is drawn under the spans
    roles = [(t.meta or {}).get("role") for t in view.figure.data]
    assert roles == sorted(roles, key=lambda r: r != "gap")
    total_gap_us = sum(w for _, _, w in gaps)
    assert total_gap_us == pytest.approx(sum(s.bubble_ns for s in result.stages) / 1e3)


def test_large_windows_are_aggregated_into_busy_share_bins() -> None:
    n = 20_000
    start = np.arange(n, dtype=np.int64) * 1_000
    spans = spans_frame(
        pd.DataFrame(
            {
                "rank": np.zeros(n, np.int32),
                "stage": 0,
                "lane": "compute",
                "kind": "forward",
                "name": "forward",
                "mb": np.arange(n) % 4,
                "step": -1,
                "chunk": 0,
                "phase": "",
                "start_ns": start,
                "end_ns": start + 250,  # busy a quarter of the time
                "nbytes": 0,
                "tokens": 0,
                "peer": -1,
            }
        )
    )
    view = gantt_figure(spans, max_bars=1_000)
    assert view.aggregated and view.spans_in_window == n
    (trace,) = view.figure.data
    assert trace.type == "heatmap" and trace.meta["role"] == "binned"
    share = np.asarray(trace.z, float)
    assert share.shape == (1, AGGREGATE_BINS) and view.bars == AGGREGATE_BINS
    # busy time is conserved: Σ share × bin width = Σ span durations (250 ns each, in ms)
    assert float(np.nansum(share) * trace.dx) == pytest.approx(n * 0.25e-3, rel=1e-6)
    assert float(np.asarray(trace.customdata).sum()) == n  # every span starts in exactly one bin
    assert trace.x0 == pytest.approx(trace.dx / 2)
    assert "aggregated" in view.note and "20,000 spans" in view.note


def test_the_aggregate_colours_compute_as_busy_and_waits_and_sends_as_idle() -> None:
    view = gantt_figure(_trace().spans, max_bars=0)
    (heat,) = view.figure.data
    assert view.aggregated and heat.type == "heatmap"
    share = dict(zip(heat.y, np.asarray(heat.z, float), strict=True))
    # rank 1 waits 1,000-1,620 ns on its recv lane and rank 0 sends: recorded, never computing
    assert np.nanmax(share["rank 1 · recv"]) == 0.0 and np.isfinite(share["rank 1 · recv"]).any()
    assert np.nanmax(share["rank 0 · send"]) == 0.0
    # compute is busy, and its busy time is conserved (0.5 + 0.75 µs on rank 0, in ms × bins)
    assert float(np.nansum(share["rank 0 · compute"]) * heat.dx) == pytest.approx(1.25e-3)
    assert float(np.nansum(share["rank 1 · compute"]) * heat.dx) == pytest.approx(0.38e-3)
    # an idle stretch with nothing recorded is empty, not 0%
    assert np.isnan(share["rank 1 · compute"][0])


def _lab(hex_color: str) -> npt.NDArray[np.float64]:
    """sRGB `#RRGGBB` to CIELAB (D65)."""
    rgb = np.array([int(hex_color[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    lin = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    m = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
    xyz = m @ lin / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_lab_conversion_matches_known_values() -> None:
    assert _lab("#FFFFFF") == pytest.approx([100, 0, 0], abs=0.05)
    assert _lab("#FF0000") == pytest.approx([53.24, 80.09, 67.20], abs=0.05)


def test_every_cause_has_a_colour_clearly_apart_from_every_other_and_from_busy() -> None:
    assert set(CAUSE_COLORS) == set(CAUSES)  # memcpy, dp_sync and optimizer included
    colours = FIGURE_COLORS  # each cause, and busy time as the breakdown draws it
    close = [
        (a, b, round(float(np.linalg.norm(_lab(colours[a]) - _lab(colours[b]))), 1))
        for a, b in itertools.combinations(colours, 2)
        if np.linalg.norm(_lab(colours[a]) - _lab(colours[b])) <= CAUSE_DELTA_E
    ]
    assert close == [], f"causes whose colours read alike (ΔE ≤ {CAUSE_DELTA_E})"


def test_the_time_axis_and_the_notes_are_in_ms() -> None:
    result = analyze(_trace())
    gaps, stage_ranks = result.gaps, {s.stage: s.ranks for s in result.stages}
    for max_bars in (6000, 0, 2):  # each span drawn, aggregated, only the longest gaps shaded
        view = gantt_figure(_trace().spans, gaps=gaps, stage_ranks=stage_ranks, max_bars=max_bars)
        assert view.figure.layout.xaxis.title.text == "time since run start (ms)"
        assert "µs" not in view.note and "us " not in view.note
        for t in view.figure.data:
            assert " ms" in t.hovertemplate and "µs" not in t.hovertemplate
    assert "bins of 0.00000135 ms" in gantt_figure(_trace().spans, max_bars=0).note  # 1,350 ns / 1,000 bins


def test_row_labels_order_ranks_then_lanes() -> None:
    assert row_labels(_trace().spans)[:3] == ["rank 0 · compute", "rank 0 · send", "rank 1 · compute"]


def test_usage_falls_back_to_cpu_and_says_so() -> None:
    rows = [(t, r, -1, str(Metric.CPU_UTIL_PCT), 10.0 * r) for r in (0, 1) for t in (0, 1_000_000_000)]
    cpu = usage_figure(counters_frame(pd.DataFrame(rows, columns=["ts_ns", "rank", "device", "metric", "value"])))
    assert cpu is not None and cpu.device == "cpu" and "no GPU counters" in cpu.label
    assert sorted(t.name for t in cpu.figure.data) == ["rank 0", "rank 1"]
    gpu_rows = [*rows, (0, 0, 0, str(Metric.GPU_UTIL_PCT), 90.0), (0, 0, 0, str(Metric.GPU_MEM_USED_BYTES), 2**31)]
    gpu = usage_figure(counters_frame(pd.DataFrame(gpu_rows, columns=["ts_ns", "rank", "device", "metric", "value"])))
    assert gpu is not None and gpu.device == "gpu"
    mem = next(t for t in gpu.figure.data if t.yaxis == "y2")
    assert list(mem.y) == [2.0]  # GiB
    assert usage_figure(counters_frame()) is None


def test_compare_table_deltas() -> None:
    a = analyze(_trace())
    slower = [(r, lane, k, mb, s, s + 2 * (e - s)) for r, lane, k, mb, s, e in SPANS]
    b = analyze(_trace(slower))
    table = compare_table(a, b).set_index("measure")
    row = table.loc["bubble ratio"]
    assert row["B - A"] == pytest.approx(b.bubble_ratio - a.bubble_ratio)
    assert table.loc["window (ms)", "B / A"] > 1


def test_jobs_compared_stage_by_stage_and_a_pipeline_as_a_job_of_one() -> None:
    import dataclasses

    from replica_helpers import replica_job

    from ppscope.analysis.placement import apply_placement, placement_of
    from ppscope.analysis.replicas import ReplicaAnalysis, analyze_replicas

    def job(trace: Trace) -> ReplicaAnalysis:
        placement = placement_of(trace)
        assert placement is not None
        return analyze_replicas(apply_placement(trace, placement), placement)

    a, b = job(replica_job(3, 4, slow={(1, 2): 1.5})), job(replica_job(2, 4))  # A's rank 6 = stage 1, replica 2
    spread = spread_compare_table(a, b).set_index("stage")
    assert spread.loc[1, "A straggler"] == "rank 6, replica 2, +50.0%" and spread.loc[1, "B straggler"] == "none"
    assert spread.loc[1, "slowest B - A"] == pytest.approx((b.stages[1].slowest_ns - a.stages[1].slowest_ns) / 1e6)
    assert spread.loc[2, "A median"] > 0 and pd.isna(spread.loc[2, "B median"])  # stage 2 is A's alone
    assert pd.isna(spread.loc[2, "median B - A"]) and spread.loc[2, "B straggler"] == "—"
    busy = spread_compare_table(a, dataclasses.replace(b, basis="busy"))  # timed otherwise: no difference taken
    assert busy["median B - A"].isna().all() and busy["B median"].notna().sum() == 2
    one = analyze(replica_job(3, 1, slow={(0, 0): 2.0}))
    table = job_compare_table(a, one).set_index("measure")
    assert table.loc["data-parallel pipelines", "B"] == 1
    assert table.loc["slowest stage vs its median over the pipelines", "A"] == pytest.approx(1.5)
    assert table.loc["slowest stage vs its median over the pipelines", "B"] == 1.0  # a job of one: its own median
    slowest = "slowest stage of any pipeline: time per micro-batch (ms)"
    assert table.loc[slowest, "B"] == pytest.approx(max(s.time_per_mb_ns for s in one.stages) / 1e6)
    assert table.loc[slowest, "B / A"] == pytest.approx(2.0 / 1.5)
    assert table.loc["bubble ratio, worst pipeline", "B"] == table.loc["bubble ratio, all pipelines", "B"]
    mixed = job_compare_table(a, dataclasses.replace(b, basis="busy")).set_index("measure")
    by_busy = slowest.replace("time per micro-batch", "busy time")
    assert pd.isna(mixed.loc[slowest, "B"]) and pd.isna(mixed.loc[by_busy, "A"])  # each basis on a row of its own
    assert mixed.loc[slowest, "A"] > 0 and mixed.loc[by_busy, "B"] > 0
    assert mixed.loc[[slowest, by_busy], "B - A"].isna().all()


def test_imported_kernels_on_stream_lanes_get_their_gaps_shaded_there() -> None:
    rows = [
        (0, "stream 7", "kernel", -1, 0, 100),
        (0, "stream 7", "kernel", -1, 300, 400),
        (0, "host", "range", -1, 0, 400),
    ]
    trace = _trace(rows)
    result = analyze(trace)
    view = gantt_figure(trace.spans, gaps=result.gaps, stage_ranks={s.stage: s.ranks for s in result.stages})
    gaps = _bars(view.figure, role="gap")
    assert [row for row, _, _ in gaps] == ["rank 0 · stream 7"]
    assert list(view.figure.layout.yaxis.categoryarray) == ["rank 0 · host", "rank 0 · stream 7"]


def test_gap_shading_counts_towards_the_bar_budget_keeping_the_longest() -> None:
    # 300 forwards with gaps of 1..299 ns between them: 299 idle gaps on one stage.
    rows, t = [], 0
    for i in range(300):
        rows.append((0, "compute", "forward", i % 4, t, t + 100))
        t += 100 + (i + 1)
    trace = _trace(rows)
    result = analyze(trace)
    assert len(result.gaps) == 299
    view = gantt_figure(trace.spans, gaps=result.gaps, stage_ranks={0: [0]}, max_bars=400)
    assert not view.aggregated and view.bars == 300
    widths_ns = sorted(round(w * 1e3) for _, _, w in _bars(view.figure, role="gap"))
    assert widths_ns == list(range(200, 300))  # the 100 longest: budget = max(400 - 300, 400 // 4)
    assert "Only the 100 longest idle gaps are shaded" in view.note


def test_a_drag_across_the_overview_strip_is_read_as_a_window() -> None:
    from ppscope.analysis.gantt import overview_figure, picked_window

    rows = [(r, "compute", "forward", 0, t, t + 500_000) for r in (0, 1) for t in range(0, 20_000_000, 1_000_000)]
    view = overview_figure(_trace(rows).spans, origin_ns=0, height_px=220)
    assert view.figure.layout.dragmode == "select" and view.figure.layout.selectdirection == "h"
    assert any((t.meta or {}).get("role") == "pick" for t in view.figure.data)  # plotly selects only on points
    origin = 5_000_000_000
    box = {"box": [{"xref": "x", "yref": "y", "x": [4.0, 2.5], "y": [0, 1]}], "points": []}
    assert picked_window(box, origin) == (origin + 2_500_000, origin + 4_000_000)
    points = {"box": [], "points": [{"x": 3.0, "y": "a"}, {"x": 1.5, "y": "a"}, {"x": 2.0}]}
    assert picked_window(points, origin) == (origin + 1_500_000, origin + 3_000_000)
    for nothing in (None, {}, {"box": [], "points": []}, {"box": [{"x": [2.0, 2.0]}], "points": [{"x": 2.0}]}):
        assert picked_window(nothing, origin) is None
